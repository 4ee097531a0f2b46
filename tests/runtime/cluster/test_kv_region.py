import numpy as np
import pytest
import torch

from dualpath.core.blocks import BlockLayout
from dualpath.runtime.engine.kv_region import contiguous, layer_spans
from dualpath.runtime.transport.transfer import SpanCopy

LAYOUT = BlockLayout(num_layers=3, block_tokens=4, kv_bytes_per_token_per_layer=2)  # Full Block 24 B


def test_layer_spans_cross_blocks_in_token_order():
    # blocks at offsets 100 and 10; layer 1 starts 8 B into a block; tokens 2..6
    spans = layer_spans(LAYOUT, [100, 10], 1, 2, 6)
    assert spans == [(100 + 8 + 2 * 2, 4), (10 + 8, 4)]
    with pytest.raises(ValueError):
        layer_spans(LAYOUT, [0], 0, 0, 5)


def test_span_copy_gathers_and_scatters_in_any_chunking():
    src = np.arange(200, dtype=np.uint8)
    src_spans = [(5, 7), (50, 3), (90, 10)]
    expected = np.concatenate([src[5:12], src[50:53], src[90:100]])
    for chunk in (1, 3, 20):
        dst = np.zeros(40, dtype=np.uint8)
        job = SpanCopy(src, src_spans, dst, [(0, 4), (30, 10), (10, 6)])
        for off in range(0, job.nbytes, chunk):
            job(off, min(chunk, job.nbytes - off))
        got = np.concatenate([dst[0:4], dst[30:40], dst[10:16]])
        assert (got == expected).all()
        assert dst[4:10].sum() == 0 and dst[16:30].sum() == 0


def test_span_copy_into_a_torch_tensor():
    src = np.arange(16, dtype=np.uint8)
    dst = torch.zeros(32, dtype=torch.uint8)
    SpanCopy(src, contiguous(0, 16), dst, [(8, 16)])(0, 16)
    assert dst[8:24].tolist() == list(range(16))


def test_span_copy_rejects_unequal_sizes():
    with pytest.raises(ValueError):
        SpanCopy(np.zeros(4, np.uint8), [(0, 4)], np.zeros(4, np.uint8), [(0, 3)])
