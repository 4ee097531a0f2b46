"""`dualpath bench transport`: bytes per second of the real path between two spawned engine
processes (shared memory + ZeroMQ control + a `LinkArbiter` at unlimited rate) next to in-process
memcpy, measured in alternating rounds in one run; chunks of REAL_SPEED_CHUNK_BYTES by default.

The holder moves a block as the engines move KV (a `LinkArbiter` transfer whose `do_chunk` is a
`ContiguousCopy` into the receiver's shared-memory buffer, then a message); its pull and ready
messages are this bench's own.

Lifecycle of one block:
1. The receiver allocates a slot in its `HostBuffer` and sends the holder
   `KvPull(request_id, layer, segment, offset_bytes, nbytes, reply_to=receiver.endpoint)`.
2. The holder's `ShmKvSender.send` submits the copy (source: its own buffer; destination: the
   pull's region, attached on first use) to its arbiter on the KV lane.
3. At delivery, on the link's thread, the sender pushes `KvReady` to `reply_to`; the receiver's
   `ShmKvReceiver.recv()` returns it and `view(ready)` reads the bytes.
4. Teardown: close the holder's arbiter, then the sender (flush notifications), the receiver and
   the host buffers (owners unlink).

Rates named `*_gbps` are GB/s (1e9 bytes per second), as in `bench.store`.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import tempfile
import threading
import zlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np

from ..core.lanes import Lane, LaneWeights
from ..runtime.clock import Clock, MonotonicClock
from ..runtime.transport.arbiter import LinkArbiter
from ..runtime.transport.channel import Inbox, Outbox, ipc_endpoint
from ..runtime.transport.messages import Stop, message
from ..runtime.transport.shm import HostBuffer, SharedSegments, ShmRegion
from ..runtime.transport.transfer import ContiguousCopy, TransferHandle, TransferResult
from .lanes import KIB, MIB

# The transport bench's link runs at real speed, where every chunk is one `do_chunk` call (~1 us)
# besides its copy. Measured (2 shared cores, 256 MiB in 16 MiB blocks, ratio to one 256 MiB
# memcpy): 1 MiB chunks ~0.55, 256 KiB ~0.54, 64 KiB ~0.49, 8 KiB (DEFAULT_CHUNK_BYTES, what the
# lanes acceptance needs) ~0.30. A latency-critical transfer waits at most one chunk's copy
# (~40 us at 256 KiB).
REAL_SPEED_CHUNK_BYTES = 256 * KIB


@message
@dataclass(frozen=True, slots=True)
class KvPull:
    """Receiver -> KV holder: write the KV of (request_id, layer) into bytes
    [offset_bytes, offset_bytes + nbytes) of segment `segment`, then send `KvReady` to `reply_to`.
    `layer` None means a Full Block (all layers)."""

    request_id: int
    layer: int | None
    segment: str
    offset_bytes: int
    nbytes: int
    reply_to: str


@message
@dataclass(frozen=True, slots=True)
class KvReady:
    """KV holder -> receiver: the bytes of (request_id, layer) are in the region (delivered)."""

    request_id: int
    layer: int | None
    segment: str
    offset_bytes: int
    nbytes: int


class ShmKvSender:
    """The holder's side: owns no buffer, writes through `segments` on `arbiter`'s link."""

    def __init__(self, arbiter: LinkArbiter, segments: SharedSegments) -> None:
        self._arbiter = arbiter
        self._segments = segments
        self._outboxes: dict[str, Outbox] = {}
        self._lock = threading.Lock()

    def send(self, request_id: int, layer: int | None, src: ShmRegion, dst: ShmRegion, reply_to: str,
             lane: Lane = Lane.KV) -> TransferHandle:
        """Copy `src` into `dst` (same size) over the link, then send `KvReady` to `reply_to`."""
        if src.nbytes != dst.nbytes:
            raise ValueError(f"source has {src.nbytes} bytes, destination {dst.nbytes}")
        do_chunk = ContiguousCopy(self._segments.view(dst), self._segments.view(src))
        outbox = self._outbox(reply_to)
        ready = KvReady(request_id, layer, dst.segment, dst.offset_bytes, dst.nbytes)

        def on_done(result: TransferResult) -> None:
            outbox.send(ready)

        return self._arbiter.submit(lane, src.nbytes, do_chunk, on_done)

    def close(self) -> None:
        """Flush and close the notification sockets (close the arbiter first)."""
        with self._lock:
            outboxes, self._outboxes = self._outboxes, {}
        for o in outboxes.values():
            o.close()

    def _outbox(self, endpoint: str) -> Outbox:
        with self._lock:
            o = self._outboxes.get(endpoint)
            if o is None:
                o = self._outboxes[endpoint] = Outbox(endpoint)
            return o


class ShmKvReceiver:
    """The receiver's side: its host buffer and the inbox `KvReady` arrives at."""

    def __init__(self, buffer: HostBuffer, endpoint: str) -> None:
        self.buffer = buffer
        self.endpoint = endpoint
        self._inbox = Inbox(endpoint)

    def recv(self, timeout_s: float | None = None) -> KvReady | None:
        """The next `KvReady`, or None after `timeout_s`; other messages raise `TypeError`."""
        msg = self._inbox.recv(timeout_s)
        if msg is not None and not isinstance(msg, KvReady):
            raise TypeError(f"expected KvReady on {self.endpoint}, got {type(msg).__name__}")
        return msg

    def view(self, ready: KvReady) -> np.ndarray:
        return self.buffer.view(ShmRegion(ready.segment, ready.offset_bytes, ready.nbytes))

    def close(self) -> None:
        self._inbox.close()


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
                break  # else a KvPull: the only other message this bench sends
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

    result = _rates(total_bytes, transport_s, baseline.seconds)
    return {"total_bytes": total_bytes, "block_bytes": block_bytes, "chunk_bytes": chunk_bytes, "repeats": repeats,
            "engine_nt_threshold_bytes": engine_nt_threshold_bytes, **result, "checksum_ok": src_crc == dst_crc}


def _rates(total_bytes: int, transport_s: list[float], memcpy_s: dict[str, list[float]]) -> dict[str, Any]:
    """GB/s (best and median of the rounds) of the transport and of the memcpy baselines."""
    def gbps(seconds: list[float], pick: Callable[[list[float]], float]) -> float:
        return total_bytes / pick(seconds) / 1e9

    def median(xs: list[float]) -> float:
        return float(np.median(xs))

    method = min(("numpy.copyto", "ctypes.memmove"), key=lambda k: min(memcpy_s[k]))
    transport_gbps, memcpy_gbps = gbps(transport_s, min), gbps(memcpy_s[method], min)
    blockwise_gbps = gbps(memcpy_s["blockwise"], min)
    transport_median, memcpy_median = gbps(transport_s, median), gbps(memcpy_s[method], median)
    return {"transport_gbps": transport_gbps, "memcpy_gbps": memcpy_gbps, "ratio": transport_gbps / memcpy_gbps,
            "memcpy_method": method,
            "memcpy_numpy_gbps": gbps(memcpy_s["numpy.copyto"], min),
            "memcpy_memmove_gbps": gbps(memcpy_s["ctypes.memmove"], min),
            "memcpy_blockwise_gbps": blockwise_gbps, "ratio_blockwise": transport_gbps / blockwise_gbps,
            "transport_median_gbps": transport_median, "memcpy_median_gbps": memcpy_median,
            "ratio_median": transport_median / memcpy_median}


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
