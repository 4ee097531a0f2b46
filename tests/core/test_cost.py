"""Cost model: Table 1 of the paper (docs/paper.md §4.1) and the chunk FLOP arithmetic."""

import pytest

from dualpath.costmodel.cost import (
    attention_flops_per_token,
    cache_compute_ratio_gb_per_pflop,
    chunk_attention_flops,
)
from dualpath.costmodel.models import DS_V32_660B, QWEN25_32B, get_model

# docs/paper.md §4.1 Table 1: GB/PFLOP at 16K and 64K context, append 429
TABLE1 = {
    "qwen2.5-32b": (117, 267),
    "gpt-oss-120b": (47, 95),
    "qwen3-235b-a22b": (39, 60),
    "ds-v3.2-660b": (13, 36),
}
DS_V3_PAPER = (4.8, 5.8)


@pytest.mark.parametrize("name", sorted(TABLE1))
def test_table1_within_ten_percent(name):
    m = get_model(name)
    for ctx, paper in zip((16384, 65536), TABLE1[name]):
        ours = cache_compute_ratio_gb_per_pflop(m, ctx)
        assert abs(ours / paper - 1) <= 0.10, f"{name} at {ctx}: {ours:.2f} vs paper {paper}"


def test_ds_v3_row_matches_the_independent_reconstruction_not_the_paper():
    """DeepSeek-V3 is the one row the public accounting does not reproduce: docs/hardware.md §6 derives
    4.3 / 5.1 (FP8 latent, dense MQA-mode attention) against the paper's 4.8 / 5.8 and notes that
    the paper's V3 accounting is unknown. We keep the physical count and report the gap
    (`dualpath repro`, docs/results/repro/table1.json): -9% at 16K, -11% at 64K."""
    m = get_model("ds-v3-660b")
    ours = [cache_compute_ratio_gb_per_pflop(m, c) for c in (16384, 65536)]
    assert ours == pytest.approx([4.37, 5.16], abs=0.01)
    assert [round(o / p - 1, 2) for o, p in zip(ours, DS_V3_PAPER)] == [-0.09, -0.11]


def test_quoted_22_gb_per_pflop_for_v32_at_the_trace_mean():
    assert cache_compute_ratio_gb_per_pflop(DS_V32_660B, 32721 - 429) == pytest.approx(22, rel=0.05)


def test_dense_chunk_attention_is_the_causal_sum():
    # tokens i = 0..n-1 attend cached + i + 1 keys
    n, c = 7, 100
    expected = QWEN25_32B.attn_flops_per_key * sum(c + i + 1 for i in range(n))
    assert chunk_attention_flops(QWEN25_32B, c, n) == pytest.approx(expected)


def test_sparse_chunk_attention_saturates_at_topk_but_indexer_does_not():
    m = DS_V32_660B
    n, c = 10, 2040  # keys 2041..2050: the first 8 are <= 2048
    attended = sum(min(c + i + 1, 2048) for i in range(n))
    keys = sum(c + i + 1 for i in range(n))
    expected = m.attn_flops_per_key * attended + m.indexer_flops_per_key * keys
    assert chunk_attention_flops(m, c, n) == pytest.approx(expected)
    assert attention_flops_per_token(m, 10**6) == pytest.approx(m.attn_flops_per_key * 2048 + m.indexer_flops_per_key * 10**6)


def test_unknown_model_names_the_choices():
    with pytest.raises(KeyError, match="ds-v3.2-660b"):
        get_model("nope")
