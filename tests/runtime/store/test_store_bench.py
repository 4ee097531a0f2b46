"""The store bench on a tiny size: it reads back every block and cleans up after itself."""

import os

import pytest

from dualpath.core.blocks import BlockLayout
from dualpath.bench.store import checksum_gbps, run_store_bench


def test_bench_reports_both_rates_and_leaves_nothing(tmp_path):
    layout = BlockLayout(num_layers=4, block_tokens=64, kv_bytes_per_token_per_layer=64)  # 16 KiB
    result = run_store_bench(tmp_path, 20 * 16384 + 1, layout, num_threads=2, repeats=1)
    assert result["num_blocks"] == 21 and result["payload_bytes"] == 21 * 16384
    assert result["ratio"] == pytest.approx(result["store_read_gbps"] / result["direct_read_gbps"])
    assert result["meets_target"] == (result["ratio"] >= 0.8)
    assert result["cache_bypass"] in ("O_DIRECT", "posix_fadvise(DONTNEED)")
    assert result["store_used_o_direct"] == (result["cache_bypass"] == "O_DIRECT")
    assert result["checksum_gbps"] > 0
    assert os.listdir(tmp_path) == []


def test_bench_refuses_nonsense():
    with pytest.raises(ValueError):
        run_store_bench("/nonexistent", 0, BlockLayout(1, 1, 1), 1)


def test_checksum_rate_is_bytes_over_time():
    assert checksum_gbps(memoryview(bytearray(1 << 20)), num_threads=2) > 0
