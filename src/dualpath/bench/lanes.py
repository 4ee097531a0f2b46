"""`dualpath bench lanes`, a few seconds: `run_lanes_bench`: is a latency-critical burst protected from a saturating KV backlog on one
emulated link? Latencies are those of the emulated link (`TransferResult.completed_s`); the
`observed_*` figures add the link thread's lag (OS sleep overshoot, GIL) and show whether the
thread kept up with the link in real time.

Expected: with lanes a burst waits at most one KV chunk, so p99 <= (burst + chunk) / burst x the
unloaded latency (1.125 with 64 KiB bursts and the default 8 KiB chunks, `DEFAULT_CHUNK_BYTES`;
the 1.2 acceptance needs chunks <= 12.8 KiB); one FIFO lane makes it wait behind the whole KV
backlog.

Rates named `*_gbps` are GB/s (1e9 bytes per second), as in `bench.store`.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..core.lanes import Lane, LaneWeights
from ..runtime.clock import Clock, MonotonicClock
from ..runtime.transport.arbiter import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_LAG_S, LinkArbiter
from ..runtime.transport.transfer import ArbiterClosed, TransferHandle, TransferResult

KIB = 1024
MIB = 1024 * 1024


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


def _copier(nbytes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, nbytes, dtype=np.uint8), np.zeros(nbytes, dtype=np.uint8)


class _KvBacklog:
    """Keeps `depth` KV transfers queued on the link: each completion submits the next."""

    def __init__(self, arbiter: LinkArbiter, transfer_bytes: int, depth: int) -> None:
        self._arbiter = arbiter
        self._src, self._dst = _copier(transfer_bytes, seed=1)
        self._bytes = transfer_bytes
        self._stop = threading.Event()
        for _ in range(depth):
            self._submit()

    def _do_chunk(self, offset_bytes: int, nbytes: int) -> None:
        np.copyto(self._dst[offset_bytes:offset_bytes + nbytes], self._src[offset_bytes:offset_bytes + nbytes])

    def _submit(self, _: TransferResult | None = None) -> None:
        if self._stop.is_set():
            return
        try:
            self._arbiter.submit(Lane.KV, self._bytes, self._do_chunk, self._submit)
        except ArbiterClosed:
            pass

    def stop(self) -> None:
        self._stop.set()


def _bursts(arbiter: LinkArbiter, clock: Clock, burst_bytes: int, interval_s: float, num: int,
            wait_each: bool) -> list[TransferResult]:
    src, dst = _copier(burst_bytes, seed=2)

    def do_chunk(offset_bytes: int, nbytes: int) -> None:
        np.copyto(dst[offset_bytes:offset_bytes + nbytes], src[offset_bytes:offset_bytes + nbytes])

    handles: list[TransferHandle] = []
    for _ in range(num):
        # at least interval_s apart: a sender that wakes late must not catch up with two at once,
        # which would measure a burst queueing behind its own lane
        clock.sleep_s(interval_s)
        h = arbiter.submit(Lane.LATENCY_CRITICAL, burst_bytes, do_chunk)
        handles.append(h)
        if wait_each:
            h.wait(timeout_s=10.0)
    return [h.wait(timeout_s=10.0) for h in handles]


def _latency_summary(prefix: str, results: list[TransferResult]) -> dict[str, float]:
    lat = [r.latency_s for r in results]
    seen = [r.notified_s - r.submitted_s for r in results]
    return {f"{prefix}_p50_us": _pct(lat, 50) * 1e6, f"{prefix}_p99_us": _pct(lat, 99) * 1e6,
            f"{prefix}_max_us": max(lat) * 1e6, f"{prefix}_observed_p50_us": _pct(seen, 50) * 1e6,
            f"{prefix}_observed_p99_us": _pct(seen, 99) * 1e6}


def run_lanes_bench(duration_s: float, link_rate_bytes_per_s: float, burst_bytes: int = 64 * KIB,
                    burst_interval_s: float = 0.005, fifo: bool = False, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                    kv_transfer_bytes: int = 1 * MIB, kv_backlog: int = 4,
                    max_lag_s: float | None = DEFAULT_MAX_LAG_S, clock: Clock | None = None) -> dict[str, Any]:
    """Latency of latency-critical bursts on a link saturated by KV, with lanes or one FIFO lane.

    Phase 1 (unloaded): bursts alone, one at a time. Phase 2 (loaded, `duration_s`): `kv_backlog`
    KV transfers of `kv_transfer_bytes` always queued, a burst every `burst_interval_s`.
    """
    clock = clock or MonotonicClock()
    num_unloaded = max(20, round(0.25 * duration_s / burst_interval_s))
    num_loaded = max(1, round(duration_s / burst_interval_s))
    with LinkArbiter("bench-lanes", link_rate_bytes_per_s, LaneWeights(), clock, chunk_bytes, fifo, max_lag_s) as arbiter:
        unloaded = _bursts(arbiter, clock, burst_bytes, burst_interval_s, num_unloaded, wait_each=True)
        before = arbiter.stats()
        t0 = clock.now_s()
        backlog = _KvBacklog(arbiter, kv_transfer_bytes, kv_backlog)
        loaded = _bursts(arbiter, clock, burst_bytes, burst_interval_s, num_loaded, wait_each=False)
        elapsed_s = clock.now_s() - t0
        after = arbiter.stats()
        backlog.stop()
    out: dict[str, Any] = {
        "mode": "fifo" if fifo else "lanes", "link_rate_gbps": link_rate_bytes_per_s / 1e9,
        "chunk_bytes": chunk_bytes, "burst_bytes": burst_bytes, "burst_interval_s": burst_interval_s,
        "kv_backlog_bytes": kv_backlog * kv_transfer_bytes, "num_bursts": len(loaded),
    }
    out.update(_latency_summary("unloaded", unloaded))
    out.update(_latency_summary("loaded", loaded))
    out["p99_over_unloaded"] = out["loaded_p99_us"] / out["unloaded_p50_us"]
    out["lanes_bound"] = (burst_bytes + chunk_bytes) / burst_bytes
    kv_bytes = after.sent_bytes[Lane.KV] - before.sent_bytes[Lane.KV]
    lc_bytes = after.sent_bytes[Lane.LATENCY_CRITICAL] - before.sent_bytes[Lane.LATENCY_CRITICAL]
    out["kv_throughput_gbps"] = kv_bytes / elapsed_s / 1e9
    out["link_utilisation"] = (kv_bytes + lc_bytes) / elapsed_s / link_rate_bytes_per_s
    out["loaded_lag_p99_us"] = _pct([r.notified_s - r.completed_s for r in loaded], 99) * 1e6
    out["stalled_s"] = after.stalled_s
    return out
