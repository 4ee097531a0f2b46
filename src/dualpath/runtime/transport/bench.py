"""Transport benchmarks (`dualpath bench lanes`, `dualpath bench transport`); a few seconds each.

`run_lanes_bench`: is a latency-critical burst protected from a saturating KV backlog on one
emulated link? Latencies are those of the emulated link (`TransferResult.completed_s`); the
`observed_*` figures add the link thread's lag (OS sleep overshoot, GIL) and show whether the
thread kept up with the link in real time.

Expected: with lanes a burst waits at most one KV chunk, so p99 <= (burst + chunk) / burst x the
unloaded latency (1.125 with 64 KiB bursts and the default 8 KiB chunks, `DEFAULT_CHUNK_BYTES`;
the 1.2 acceptance needs chunks <= 12.8 KiB); one FIFO lane makes it wait behind the whole KV
backlog.

`run_transport_bench`: bytes per second of the real path between two spawned engine processes
(shared memory + ZeroMQ control + arbiter at unlimited rate) next to in-process memcpy, measured
in alternating rounds in one run; chunks of REAL_SPEED_CHUNK_BYTES by default.

Rates named `*_gbps` are GB/s (1e9 bytes per second), as in `runtime.store.bench`.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import tempfile
import threading
import zlib
from typing import Any, Callable, Iterator

import numpy as np

from ...core.lanes import Lane, LaneWeights
from ..clock import Clock, MonotonicClock
from .arbiter import DEFAULT_CHUNK_BYTES, DEFAULT_MAX_LAG_S, LinkArbiter
from .channel import Inbox, Outbox, ipc_endpoint
from .kv_transfer import ShmKvReceiver, ShmKvSender
from .messages import KvPull, KvReady, Stop
from .shm import HostBuffer, SharedSegments, ShmRegion
from .transfer import ArbiterClosed, TransferHandle, TransferResult

KIB = 1024
MIB = 1024 * 1024
# The transport bench's link runs at real speed, where every chunk is one `do_chunk` call (~1 us)
# besides its copy. Measured (2 shared cores, 256 MiB in 16 MiB blocks, ratio to one 256 MiB
# memcpy): 1 MiB chunks ~0.55, 256 KiB ~0.54, 64 KiB ~0.49, 8 KiB (DEFAULT_CHUNK_BYTES, what the
# lanes acceptance needs) ~0.30. A latency-critical transfer waits at most one chunk's copy
# (~40 us at 256 KiB).
REAL_SPEED_CHUNK_BYTES = 256 * KIB


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


# --- transport: two spawned engine processes ---------------------------------------------------


def holder_process_main(endpoint: str, num_blocks: int, block_bytes: int, chunk_bytes: int, conn: Any) -> None:
    """KV holder: serves `KvPull`s from its host buffer through its link until `Stop`."""
    with HostBuffer.create(block_bytes, num_blocks) as buf, Inbox(endpoint) as inbox:
        rng = np.random.default_rng(3)
        regions = [buf.allocate() for _ in range(num_blocks)]
        for r in regions:
            buf.view(r)[:] = rng.integers(0, 256, block_bytes, dtype=np.uint8)
        crc = 0
        for r in regions:
            crc = zlib.crc32(buf.view(r), crc)
        segments = SharedSegments(own=(buf,))
        arbiter = LinkArbiter("holder-cnic", None, LaneWeights(), MonotonicClock(), chunk_bytes)
        sender = ShmKvSender(arbiter, segments)
        conn.send(("ready", crc))
        handles = []
        while True:
            msg = inbox.recv()
            if isinstance(msg, Stop):
                break
            assert isinstance(msg, KvPull)
            dst = ShmRegion(msg.segment, msg.offset_bytes, msg.nbytes)
            handles.append(sender.send(msg.request_id, msg.layer, regions[msg.request_id], dst, msg.reply_to))
            handles = [h for h in handles if not h.done()]
        for h in handles:
            h.wait(timeout_s=60.0)
        del handles
        arbiter.close()
        sender.close()
        segments.close()
        del regions
    conn.send(("done", None))


def receiver_process_main(endpoint: str, holder_endpoint: str, num_blocks: int, block_bytes: int, conn: Any) -> None:
    """Receiver: on each "go", pulls every block (all pulls sent at once, so the holder's link
    is never idle waiting for a request) and reports the time until the last `KvReady`; on
    "stop", checksums what arrived."""
    clock = MonotonicClock()
    with HostBuffer.create(block_bytes, num_blocks) as buf:
        receiver = ShmKvReceiver(buf, endpoint)
        holder = Outbox(holder_endpoint)
        regions = [buf.allocate() for _ in range(num_blocks)]
        conn.send(("ready", None))
        assert conn.recv() == "go"
        # Setup, untimed: one block end to end, so the holder attaches (registers) this buffer.
        holder.send(KvPull(0, None, regions[0].segment, regions[0].offset_bytes, regions[0].nbytes, endpoint))
        if receiver.recv(timeout_s=60.0) is None:
            raise TimeoutError("no KvReady for the setup block within 60 s")
        got: dict[int, KvReady] = {}
        while True:
            t0 = clock.now_s()
            for i, r in enumerate(regions):
                holder.send(KvPull(i, None, r.segment, r.offset_bytes, r.nbytes, endpoint))
            for _ in range(num_blocks):
                ready = receiver.recv(timeout_s=60.0)
                if ready is None:
                    raise TimeoutError("no KvReady within 60 s")
                got[ready.request_id] = ready
            conn.send(("round", clock.now_s() - t0))
            if conn.recv() != "go":
                break
        crc = 0
        for i in range(num_blocks):
            crc = zlib.crc32(receiver.view(got[i]), crc)
        holder.send(Stop("done"))
        holder.close()
        receiver.close()
    conn.send(("done", crc))


class _MemcpyBaseline:
    """In-process copies of `total_bytes` between two plain (anonymous-memory) numpy arrays, both
    touched beforehand: one call (`np.copyto`, `ctypes.memmove`) and one call per block."""

    def __init__(self, total_bytes: int, block_bytes: int) -> None:
        self.src = np.empty(total_bytes, dtype=np.uint8)
        self.src.fill(0x5A)  # mapped: an untouched source would read the shared zero page
        self.dst = np.zeros(total_bytes, dtype=np.uint8)
        self.dst.fill(0)  # mapped: no page faults in the timed copies
        self.total_bytes, self.block_bytes = total_bytes, block_bytes
        self.seconds: dict[str, list[float]] = {k: [] for k in ("numpy.copyto", "ctypes.memmove", "blockwise")}

    def round(self, clock: Clock) -> None:
        src, dst, n, b = self.src, self.dst, self.total_bytes, self.block_bytes
        t0 = clock.now_s()
        np.copyto(dst, src)
        t1 = clock.now_s()
        ctypes.memmove(dst.ctypes.data, src.ctypes.data, n)
        t2 = clock.now_s()
        for off in range(0, n, b):
            ctypes.memmove(dst.ctypes.data + off, src.ctypes.data + off, b)
        t3 = clock.now_s()
        for k, dt in (("numpy.copyto", t1 - t0), ("ctypes.memmove", t2 - t1), ("blockwise", t3 - t2)):
            self.seconds[k].append(dt)


@contextlib.contextmanager
def _engine_env(nt_threshold_bytes: int | None) -> Iterator[None]:
    """Environment for engine processes started inside the block (spawn copies os.environ)."""
    if nt_threshold_bytes is None:
        yield
        return
    old = os.environ.get("GLIBC_TUNABLES")
    tunable = f"glibc.cpu.x86_non_temporal_threshold={nt_threshold_bytes:#x}"
    os.environ["GLIBC_TUNABLES"] = tunable if old is None else f"{old}:{tunable}"
    try:
        yield
    finally:
        if old is None:
            del os.environ["GLIBC_TUNABLES"]
        else:
            os.environ["GLIBC_TUNABLES"] = old


def run_transport_bench(total_bytes: int = 256 * MIB, block_bytes: int = 16 * MIB,
                        chunk_bytes: int = REAL_SPEED_CHUNK_BYTES, timeout_s: float = 120.0,
                        repeats: int = 5, engine_nt_threshold_bytes: int | None = None) -> dict[str, Any]:
    """GB/s of KV transfers between two spawned processes vs in-process memcpy, side by side.

    `repeats` rounds, each: the receiver pulls all `total_bytes` (one `KvPull` per block, all
    sent at once) through the holder's unlimited-rate link, then this process copies the same
    number of bytes in-process. Rates are best of the rounds (`*_median_gbps`: medians).
    `memcpy_gbps` is one plain copy of all `total_bytes`, with whichever of `np.copyto` and
    `ctypes.memmove` was faster (`memcpy_method`); `memcpy_blockwise_gbps` copies the same bytes
    one block per call. They differ because glibc switches to non-temporal stores only for copies
    above its threshold (~99 MiB here, `ld.so --list-tunables`), which no block or chunk copy
    reaches. The transport also copies between shared-memory (tmpfs) mappings, which get no
    transparent huge pages, while the baseline's numpy arrays may.

    `engine_nt_threshold_bytes` (off by default) starts the engine processes with glibc's
    non-temporal threshold lowered to it (GLIBC_TUNABLES, x86 glibc only), e.g. to
    `chunk_bytes`: chunk copies then use non-temporal stores like the one large copy does
    (measured ~0.79 of it instead of ~0.54 with 256 KiB chunks). It applies to every memcpy of
    the engine processes, and only this bench sets it.
    """
    if total_bytes <= 0 or block_bytes <= 0 or total_bytes % block_bytes:
        raise ValueError("total_bytes must be a positive multiple of block_bytes")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    num_blocks = total_bytes // block_bytes
    clock = MonotonicClock()
    baseline = _MemcpyBaseline(total_bytes, block_bytes)
    transport_s: list[float] = []
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="dp-") as tmp:
        holder_ep, recv_ep = ipc_endpoint(tmp, "holder"), ipc_endpoint(tmp, "receiver")
        (h_parent, h_child), (r_parent, r_child) = ctx.Pipe(), ctx.Pipe()
        procs = [ctx.Process(target=holder_process_main, args=(holder_ep, num_blocks, block_bytes, chunk_bytes, h_child)),
                 ctx.Process(target=receiver_process_main, args=(recv_ep, holder_ep, num_blocks, block_bytes, r_child))]
        with _engine_env(engine_nt_threshold_bytes):
            for p in procs:
                p.start()
        try:
            _, src_crc = _expect(h_parent, procs, "ready", timeout_s)
            _expect(r_parent, procs, "ready", timeout_s)
            for i in range(repeats):
                r_parent.send("go")
                transport_s.append(_expect(r_parent, procs, "round", timeout_s)[1])
                baseline.round(clock)  # while the engines idle
            r_parent.send("stop")
            _, dst_crc = _expect(r_parent, procs, "done", timeout_s)
            _expect(h_parent, procs, "done", timeout_s)
        finally:
            for p in procs:
                p.join(timeout=10.0)
                if p.is_alive():
                    p.terminate()

    def gbps(seconds: list[float], pick: Callable[[list[float]], float]) -> float:
        return total_bytes / pick(seconds) / 1e9

    def median(xs: list[float]) -> float:
        return float(np.median(xs))

    method = min(("numpy.copyto", "ctypes.memmove"), key=lambda k: min(baseline.seconds[k]))
    transport_gbps, memcpy_gbps = gbps(transport_s, min), gbps(baseline.seconds[method], min)
    blockwise_gbps = gbps(baseline.seconds["blockwise"], min)
    transport_median, memcpy_median = gbps(transport_s, median), gbps(baseline.seconds[method], median)
    return {"total_bytes": total_bytes, "block_bytes": block_bytes, "chunk_bytes": chunk_bytes, "repeats": repeats,
            "engine_nt_threshold_bytes": engine_nt_threshold_bytes,
            "transport_gbps": transport_gbps, "memcpy_gbps": memcpy_gbps, "ratio": transport_gbps / memcpy_gbps,
            "memcpy_method": method,
            "memcpy_numpy_gbps": gbps(baseline.seconds["numpy.copyto"], min),
            "memcpy_memmove_gbps": gbps(baseline.seconds["ctypes.memmove"], min),
            "memcpy_blockwise_gbps": blockwise_gbps, "ratio_blockwise": transport_gbps / blockwise_gbps,
            "transport_median_gbps": transport_median, "memcpy_median_gbps": memcpy_median,
            "ratio_median": transport_median / memcpy_median,
            "checksum_ok": src_crc == dst_crc}


def _expect(conn: Any, procs: list[Any], tag: str, timeout_s: float, poll_s: float = 0.1) -> tuple[str, Any]:
    """Wait for `(tag, payload)` on `conn`; fail early if an engine process died."""
    for _ in range(max(1, round(timeout_s / poll_s))):
        if conn.poll(poll_s):
            break
        dead = [p for p in procs if p.exitcode not in (None, 0)]
        if dead:
            raise RuntimeError(f"engine process {dead[0].name} exited with code {dead[0].exitcode}")
    else:
        raise TimeoutError(f"no {tag!r} from an engine process within {timeout_s} s")
    msg = conn.recv()
    if msg[0] != tag:
        raise RuntimeError(f"expected {tag!r} from an engine process, got {msg!r}")
    return msg
