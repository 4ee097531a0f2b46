"""The benchmarks run end to end and show what they are for (short runs)."""

import pytest

from dualpath.bench.lanes import KIB, MIB, run_lanes_bench
from dualpath.bench.transport import run_transport_bench


def test_lanes_protect_latency_critical_bursts_and_fifo_does_not():
    kw = dict(duration_s=0.25, link_rate_bytes_per_s=1e9, burst_interval_s=0.005,  # default 8 KiB chunks
              kv_transfer_bytes=256 * KIB, max_lag_s=1.0)  # absorb any host jitter: exact link times
    lanes = run_lanes_bench(fifo=False, **kw)
    fifo = run_lanes_bench(fifo=True, **kw)
    assert lanes["unloaded_p50_us"] == pytest.approx(64 * KIB / 1e9 * 1e6, rel=1e-6)
    assert lanes["p99_over_unloaded"] <= lanes["lanes_bound"] + 1e-6 <= 1.2
    assert fifo["p99_over_unloaded"] > 5.0  # queued behind about 1 MiB of KV
    assert lanes["link_utilisation"] > 0.5  # KV kept the link busy


def test_transport_bench_moves_the_bytes_intact():
    r = run_transport_bench(total_bytes=8 * MIB, block_bytes=1 * MIB, chunk_bytes=256 * KIB, repeats=2)
    assert r["checksum_ok"]
    assert r["transport_gbps"] > 0 and r["memcpy_gbps"] > 0 and r["memcpy_blockwise_gbps"] > 0
    assert r["memcpy_method"] in ("numpy.copyto", "ctypes.memmove")
    assert r["ratio"] == pytest.approx(r["transport_gbps"] / r["memcpy_gbps"])
    assert r["memcpy_gbps"] == max(r["memcpy_numpy_gbps"], r["memcpy_memmove_gbps"])
