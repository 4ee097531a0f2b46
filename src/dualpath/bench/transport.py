"""Shared memory between two engine processes, one of the four transfers of `dualpath bench
transport` (transport_run.py runs them side by side): a holder process serves pulls from its host
buffer through a `LinkArbiter` at unlimited rate, the bytes land in the receiver's host buffer, as the
engines move KV; chunks of REAL_SPEED_CHUNK_BYTES by default.

The holder moves a block as the engines move KV (a `LinkArbiter` transfer whose `do_chunk` is a
`ContiguousCopy` into the receiver's shared-memory buffer, then a message); its pull and ready
messages are this bench's own.

Lifecycle of one block (block k of b bytes: bytes [k * b, (k + 1) * b) of both buffers):
1. The receiver sends the holder `KvPull(k, None, segment, offset_bytes, b, reply_to=receiver.endpoint)`.
2. The holder's `ShmKvSender.send` submits the copy (source: block k of its own buffer; destination:
   the pull's region, attached on first use) to its arbiter on the KV lane.
3. At delivery, on the link's thread, the sender pushes `KvReady` to `reply_to`; the receiver's
   `ShmKvReceiver.recv()` returns it and `view(ready)` reads the bytes.
4. Teardown: close the holder's arbiter, then the sender (flush notifications), the receiver and
   the host buffers (owners unlink).

`ShmPath` drives the two processes from the bench's process: "stream" (every pull sent at once,
timed until the last `KvReady`), "each" (one block at a time, each timed), "clear" and "crc" (the
receiver's bytes, for the check that they arrived intact).
"""

from __future__ import annotations

import contextlib
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
from .lanes import KIB

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


# The seed of the bytes every transfer moves: the holder process and the bench's process draw the
# same bytes from it (`source_bytes`), so a checksum of what landed compares across processes
SOURCE_SEED = 3
# Per command to an engine process: its start-up (spawn, imports) and one round of a large run on a
# loaded 2-core machine
ENGINE_WAIT_S = 120.0


def source_bytes(nbytes: int, seed: int = SOURCE_SEED) -> np.ndarray:
    """The bytes a transfer moves: `nbytes` random bytes, the same for the same seed in any process."""
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def holder_process_main(endpoint: str, num_blocks: int, block_bytes: int, chunk_bytes: int, conn: Any) -> None:
    """KV holder: serves `KvPull`s from its host buffer through its link until `Stop`. A pull of
    `nbytes` for request k copies bytes [k * nbytes, (k + 1) * nbytes) of the buffer's
    num_blocks * block_bytes bytes (its slots back to back), so any block size is served."""
    total_bytes = num_blocks * block_bytes
    with HostBuffer.create(block_bytes, num_blocks) as buf, Inbox(endpoint) as inbox:
        whole = ShmRegion(buf.name, 0, total_bytes)
        buf.view(whole)[:] = source_bytes(total_bytes)
        crc = zlib.crc32(buf.view(whole))
        segments = SharedSegments(own=(buf,))
        arbiter = LinkArbiter("holder-cnic", None, LaneWeights(), MonotonicClock(), chunk_bytes)
        sender = ShmKvSender(arbiter, segments)
        conn.send(("ready", crc))
        handles = []
        while True:
            msg = inbox.recv()
            if isinstance(msg, Stop):
                break  # else a KvPull: the only other message this bench sends
            start = msg.request_id * msg.nbytes
            if not 0 <= start <= start + msg.nbytes <= total_bytes:
                raise ValueError(f"pull of bytes [{start}, {start + msg.nbytes}) outside the holder's {total_bytes}")
            dst = ShmRegion(msg.segment, msg.offset_bytes, msg.nbytes)
            src = ShmRegion(buf.name, start, msg.nbytes)
            handles.append(sender.send(msg.request_id, msg.layer, src, dst, msg.reply_to))
            handles = [h for h in handles if not h.done()]
        for h in handles:
            h.wait(timeout_s=60.0)
        del handles
        arbiter.close()
        sender.close()
        segments.close()
    conn.send(("done", None))


class _Puller:
    """The receiver's pulls: block k of `block_bytes` into bytes [k * block_bytes, ...) of its buffer."""

    def __init__(self, receiver: ShmKvReceiver, holder: Outbox, clock: Clock) -> None:
        self.receiver, self.holder, self.clock = receiver, holder, clock

    def _pull(self, k: int, block_bytes: int) -> None:
        self.holder.send(KvPull(k, None, self.receiver.buffer.name, k * block_bytes, block_bytes, self.receiver.endpoint))

    def _ready(self) -> KvReady:
        ready = self.receiver.recv(timeout_s=60.0)
        if ready is None:
            raise TimeoutError("no KvReady within 60 s")
        return ready

    def stream(self, block_bytes: int, num_blocks: int) -> float:
        """Every pull sent at once (the holder's link never idles waiting for one): seconds to the last KvReady."""
        t0 = self.clock.now_s()
        for k in range(num_blocks):
            self._pull(k, block_bytes)
        for _ in range(num_blocks):
            self._ready()
        return self.clock.now_s() - t0

    def each(self, block_bytes: int, num_blocks: int) -> list[float]:
        """One pull at a time: seconds from each pull to its KvReady."""
        return seconds_each(self.clock, lambda k: (self._pull(k, block_bytes), self._ready()), num_blocks)


def seconds_each(clock: Any, move: Callable[[int], Any], num_blocks: int) -> list[float]:
    """Blocks 0..num_blocks-1 moved one at a time by `move(k)` (returning once block k has landed):
    each one's seconds (a Transfer's `each`)."""
    out = []
    for k in range(num_blocks):
        t0 = clock.now_s()
        move(k)
        out.append(clock.now_s() - t0)
    return out


def receiver_process_main(endpoint: str, holder_endpoint: str, total_bytes: int, conn: Any) -> None:
    """Receiver: pulls one whole-buffer block first (untimed: the holder attaches this buffer), then
    answers ShmPath's commands on `conn` until "stop"."""
    with HostBuffer.create(total_bytes, 1) as buf:
        receiver = ShmKvReceiver(buf, endpoint)
        holder = Outbox(holder_endpoint)
        puller = _Puller(receiver, holder, MonotonicClock())
        dst = buf.view(ShmRegion(buf.name, 0, total_bytes))
        puller.each(total_bytes, 1)
        conn.send(("ready", None))
        while True:
            cmd, *args = conn.recv()
            if cmd == "stop":
                break
            if cmd == "stream":
                conn.send((cmd, puller.stream(*args)))
            elif cmd == "each":
                conn.send((cmd, puller.each(*args)))
            elif cmd == "clear":
                dst.fill(0)
                conn.send((cmd, None))
            else:  # "crc"
                conn.send((cmd, zlib.crc32(dst[:args[0]])))
        del dst
        holder.send(Stop("done"))
        holder.close()
        receiver.close()
    conn.send(("done", None))


class ShmPath:
    """Shared memory between two spawned engine processes (holder and receiver), driven from here;
    the bytes are `source_bytes(total_bytes)`. A context manager: leaving it stops both."""

    name = "shm"

    def __init__(self, total_bytes: int, chunk_bytes: int = REAL_SPEED_CHUNK_BYTES,
                 engine_nt_threshold_bytes: int | None = None, timeout_s: float = ENGINE_WAIT_S) -> None:
        self.timeout_s = timeout_s
        self._tmp = tempfile.TemporaryDirectory(prefix="dp-")
        ctx = mp.get_context("spawn")
        holder_ep, recv_ep = ipc_endpoint(self._tmp.name, "holder"), ipc_endpoint(self._tmp.name, "receiver")
        (self._holder, h_child), (self._recv, r_child) = ctx.Pipe(), ctx.Pipe()
        self._procs = [ctx.Process(target=holder_process_main, args=(holder_ep, 1, total_bytes, chunk_bytes, h_child)),
                       ctx.Process(target=receiver_process_main, args=(recv_ep, holder_ep, total_bytes, r_child))]
        with _engine_env(engine_nt_threshold_bytes):
            for p in self._procs:
                p.start()
        try:
            self.source_crc = expect(self._holder, self._procs, "ready", timeout_s)[1]
            expect(self._recv, self._procs, "ready", timeout_s)
        except BaseException:
            self.close()
            raise

    def _ask(self, cmd: str, *args: Any) -> Any:
        self._recv.send((cmd, *args))
        return expect(self._recv, self._procs, cmd, self.timeout_s)[1]

    def stream(self, block_bytes: int, num_blocks: int) -> float:
        return self._ask("stream", block_bytes, num_blocks)

    def each(self, block_bytes: int, num_blocks: int) -> list[float]:
        return self._ask("each", block_bytes, num_blocks)

    def clear(self) -> None:
        self._ask("clear")

    def landed_crc(self, nbytes: int) -> int:
        return self._ask("crc", nbytes)

    def close(self) -> None:
        if any(p.is_alive() for p in self._procs):
            with contextlib.suppress(OSError, RuntimeError, TimeoutError):
                self._recv.send(("stop",))
                expect(self._recv, self._procs, "done", self.timeout_s)
                expect(self._holder, self._procs, "done", self.timeout_s)
        for p in self._procs:
            p.join(timeout=10.0)
            if p.is_alive():
                p.terminate()
        self._tmp.cleanup()

    def __enter__(self) -> "ShmPath":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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


def expect(conn: Any, procs: list[Any], tag: str, timeout_s: float, poll_s: float = 0.1) -> tuple[str, Any]:
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
