"""Device choice for the runtime: spelling (config), availability and per-engine placement."""

import pytest
import torch

from dualpath.config import RuntimeConfig, parse_device
from dualpath.errors import InputError
from dualpath.runtime.engine import device as dev
from dualpath.runtime.transport.transfer import SpanCopy


@pytest.mark.parametrize("text,parsed", [("cpu", ("cpu", None)), ("cuda", ("cuda", None)), ("cuda:3", ("cuda", 3)),
                                         (" CUDA:0 ", ("cuda", 0))])
def test_parse_device(text, parsed):
    assert parse_device(text) == parsed


@pytest.mark.parametrize("bad", ["gpu", "cuda:", "cuda:-1", "cuda:x", "cpu:0", "", "mps"])
def test_bad_device_spelling_is_rejected_by_the_config(bad):
    with pytest.raises(InputError, match="unknown device"):
        RuntimeConfig(model="tiny", device=bad)


def test_engine_placement_round_robin_over_gpus():
    # 2P4D on 4 GPUs: engines 0..5 -> GPUs 0,1,2,3,0,1; a pinned index puts every engine there
    assert [dev.engine_device("cuda", e, 4) for e in range(6)] == ["cuda:0", "cuda:1", "cuda:2", "cuda:3", "cuda:0", "cuda:1"]
    assert [dev.engine_device("cuda:2", e, 4) for e in range(3)] == ["cuda:2"] * 3
    assert dev.engine_device("cpu", 5, 0) == "cpu"
    with pytest.raises(InputError, match="no CUDA GPU"):
        dev.engine_device("cuda", 0, 0)


def test_require_device_names_the_missing_gpu():
    dev.require_device("cpu", num_gpus=0)
    dev.require_device("cuda:1", num_gpus=2)
    with pytest.raises(InputError, match=r"device 'cuda': no CUDA GPU is visible"):
        dev.require_device("cuda", num_gpus=0)
    with pytest.raises(InputError, match=r"only 2 CUDA GPU\(s\) visible"):
        dev.require_device("cuda:2", num_gpus=2)


def test_span_copy_between_numpy_and_a_tensor_moves_the_bytes_both_ways():
    """The DE's H2D / D2H copies are SpanCopy between host arrays and the cache tensor (here on the
    CPU; on a GPU the same call is a blocking copy from pageable memory)."""
    import numpy as np

    host = np.arange(64, dtype=np.uint8)
    cache = torch.zeros(64, dtype=torch.uint8)
    SpanCopy(host, [(0, 16), (32, 16)], cache, [(16, 32)])(0, 32)
    assert cache[16:48].tolist() == list(range(16)) + list(range(32, 48)) and cache[:16].sum() == 0
    back = np.zeros(32, dtype=np.uint8)
    SpanCopy(cache, [(16, 32)], back, [(0, 32)])(0, 32)
    assert back.tolist() == cache[16:48].tolist()
