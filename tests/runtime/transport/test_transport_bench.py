"""The lanes benchmark runs end to end and shows what it is for (a short run); `bench transport` is
tested in tests/bench/test_bench_transport.py."""

import pytest

from dualpath.bench.lanes import KIB, run_lanes_bench


def test_lanes_protect_latency_critical_bursts_and_fifo_does_not():
    kw = dict(duration_s=0.25, link_rate_bytes_per_s=1e9, burst_interval_s=0.005,  # default 8 KiB chunks
              kv_transfer_bytes=256 * KIB, max_lag_s=1.0)  # absorb any host jitter: exact link times
    lanes = run_lanes_bench(fifo=False, **kw)
    fifo = run_lanes_bench(fifo=True, **kw)
    assert lanes["unloaded_p50_us"] == pytest.approx(64 * KIB / 1e9 * 1e6, rel=1e-6)
    assert lanes["p99_over_unloaded"] <= lanes["lanes_bound"] + 1e-6 <= 1.2
    assert fifo["p99_over_unloaded"] > 5.0  # queued behind about 1 MiB of KV
    assert lanes["link_utilisation"] > 0.5  # KV kept the link busy

