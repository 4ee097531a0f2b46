"""Three of the four transfers of `dualpath bench transport` (transport.py has the fourth, shared
memory between two engine processes): in-process memcpy (the reference), our remote writes over
loopback TCP, and Mooncake Transfer Engine over loopback TCP (P2P handshake, as `--transfer mooncake`).

Every transfer moves block k of b bytes from bytes [k * b, (k + 1) * b) of a source to the same
bytes of its destination, and offers the same calls (`TransferPath`): `stream` (every block issued
at once, timed until the last one landed), `each` (one block at a time, each timed from its issue to
its landing being known), `clear` and `landed_crc` (the destination, for the check that the bytes
arrived intact). The engine-to-engine transfers move each block as the engines move KV: one
`LinkArbiter` transfer on the KV lane at unlimited rate, in chunks of `chunk_bytes`.

The two network transfers write into one host buffer of the bench's process, which a target child
process (spawned, as a peer engine's process) attaches and registers with its `WriteTarget` and, when
Mooncake loads, with its own Mooncake engine. A remote write is known to have landed when its IMM
is delivered in the child (the child's clock, the same system-wide monotonic clock as ours); a
Mooncake write when its synchronous batch call returns (the peer acknowledges each write after
placing it).
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import zlib
from typing import Any, Protocol

import numpy as np

from ..core.lanes import Lane, LaneWeights
from ..errors import InputError
from ..runtime.clock import MonotonicClock
from ..runtime.transport.arbiter import LinkArbiter
from ..runtime.transport.mooncake import MooncakeAddress, MooncakeSpanWrite, MooncakeTransfer, address_of
from ..runtime.transport.remote_write import RemoteSpanWrite, WriteInitiator, WriteTarget, submit_with_immediate
from ..runtime.transport.shm import HostBuffer, SharedSegments, ShmRegion
from .transport import ENGINE_WAIT_S, expect, seconds_each

# The IMM after every remote write but the last of a stream: the target child reports only the others
QUIET_IMM = b"-"


class TransferPath(Protocol):
    name: str

    def stream(self, block_bytes: int, num_blocks: int) -> float: ...

    def each(self, block_bytes: int, num_blocks: int) -> list[float]: ...

    def clear(self) -> None: ...

    def landed_crc(self, nbytes: int) -> int: ...


class MemcpyPath:
    """In-process `memmove` of each block between two plain (anonymous-memory) arrays, the
    destination touched beforehand (no page faults in the timed copies)."""

    name = "memcpy"

    def __init__(self, src: np.ndarray) -> None:
        self.src, self.clock = src, MonotonicClock()
        self.dst = np.zeros(src.nbytes, dtype=np.uint8)
        self.dst.fill(0)  # mapped

    def _copy(self, k: int, b: int) -> None:
        ctypes.memmove(self.dst.ctypes.data + k * b, self.src.ctypes.data + k * b, b)

    def stream(self, block_bytes: int, num_blocks: int) -> float:
        t0 = self.clock.now_s()
        for k in range(num_blocks):
            self._copy(k, block_bytes)
        return self.clock.now_s() - t0

    def each(self, block_bytes: int, num_blocks: int) -> list[float]:
        return seconds_each(self.clock, lambda k: self._copy(k, block_bytes), num_blocks)

    def clear(self) -> None:
        self.dst.fill(0)

    def landed_crc(self, nbytes: int) -> int:
        return zlib.crc32(self.dst[:nbytes])


def target_child_main(segment: str, nbytes: int, with_mooncake: bool, conn: Any, landed: Any) -> None:
    """The receiving process of the network transfers: attach `segment`, register it with a
    `WriteTarget` (and a Mooncake engine), report (port, Mooncake address text, why Mooncake did not
    start or "") on `conn`, send
    (delivery time, message) of every IMM but QUIET_IMM on `landed`, until "stop" on `conn`."""
    segments = SharedSegments()
    view = segments.view(ShmRegion(segment, 0, nbytes))
    clock = MonotonicClock()

    def on_immediate(lane: Lane, msg: bytes) -> None:
        if msg != QUIET_IMM:
            landed.send((clock.now_s(), msg))

    target = WriteTarget("127.0.0.1", 0, on_immediate=on_immediate)
    target.register(segment, view)
    mooncake, error = None, ""
    if with_mooncake:
        try:
            mooncake = MooncakeTransfer.start()
            mooncake.register(segment, view)
        except (InputError, OSError) as exc:  # the other transfers still run; the bench says why
            mooncake, error = None, str(exc)
    conn.send(("ready", (target.address[1], mooncake.address().to_text() if mooncake else "", error)))
    conn.recv()
    target.close()
    target.unregister(segment)
    if mooncake is not None:
        mooncake.close()
    del view
    segments.close()
    conn.send(("done", None))


class TargetChild:
    """The destination host buffer (here) and the child process that receives into it."""

    def __init__(self, nbytes: int, with_mooncake: bool, timeout_s: float = ENGINE_WAIT_S) -> None:
        self.buf = HostBuffer.create(slot_bytes=nbytes, num_slots=1)
        self.region = ShmRegion(self.buf.name, 0, nbytes)
        self.dst = self.buf.view(self.region)
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self.landed, landed_w = ctx.Pipe(duplex=False)
        self.timeout_s = timeout_s
        self._proc = ctx.Process(target=target_child_main, args=(self.buf.name, nbytes, with_mooncake, child_conn, landed_w),
                                 daemon=True)
        self._proc.start()
        try:
            self.port, self.mooncake_address, self.mooncake_error = expect(self._conn, [self._proc], "ready", timeout_s)[1]
        except BaseException:
            self.close()
            raise

    def next_landed(self) -> tuple[float, bytes]:
        """(delivery time, message) of the next reported IMM."""
        if not self.landed.poll(self.timeout_s):
            raise TimeoutError(f"no IMM delivered in the target process within {self.timeout_s} s")
        return self.landed.recv()

    def clear(self) -> None:
        self.dst.fill(0)

    def landed_crc(self, nbytes: int) -> int:
        return zlib.crc32(self.dst[:nbytes])

    def close(self) -> None:
        if self._proc.is_alive():
            self._conn.send("stop")
            expect(self._conn, [self._proc], "done", self.timeout_s)
        self._proc.join(timeout=10.0)
        if self._proc.is_alive():
            self._proc.terminate()
        del self.dst
        self.buf.close()


class _ArbiterPath:
    """What the two network transfers share: the source, the child's buffer, an unlimited link."""

    def __init__(self, target: TargetChild, src: np.ndarray, chunk_bytes: int) -> None:
        self.target, self.src, self.clock = target, src, MonotonicClock()
        self.arbiter = LinkArbiter(f"bench-{self.name}", None, LaneWeights(), self.clock, chunk_bytes)

    name = ""

    def clear(self) -> None:
        self.target.clear()

    def landed_crc(self, nbytes: int) -> int:
        return self.target.landed_crc(nbytes)

    def close(self) -> None:
        self.arbiter.close()


class RemoteWritePath(_ArbiterPath):
    """Our remote writes: `RemoteSpanWrite` per block through the link, an IMM after each."""

    name = "tcp"

    def __init__(self, target: TargetChild, src: np.ndarray, chunk_bytes: int) -> None:
        super().__init__(target, src, chunk_bytes)
        self.initiator = WriteInitiator("127.0.0.1", target.port, lanes=(Lane.KV,))
        self._tags = 0

    def _submit(self, k: int, b: int, imm: bytes) -> None:
        job = RemoteSpanWrite(self.initiator, Lane.KV, self.src, [(k * b, b)], self.target.region, [(k * b, b)])
        submit_with_immediate(self.arbiter, job, lambda _res: imm)

    def _tag(self) -> bytes:
        self._tags += 1
        return b"t%d" % self._tags

    def _landed(self, tag: bytes) -> float:
        t, msg = self.target.next_landed()
        if msg != tag:
            raise RuntimeError(f"expected the IMM {tag!r} from the target, got {msg!r}")
        return t

    def stream(self, block_bytes: int, num_blocks: int) -> float:
        tag, t0 = self._tag(), self.clock.now_s()
        for k in range(num_blocks):
            self._submit(k, block_bytes, tag if k == num_blocks - 1 else QUIET_IMM)
        return self._landed(tag) - t0

    def each(self, block_bytes: int, num_blocks: int) -> list[float]:
        out = []
        for k in range(num_blocks):
            tag, t0 = self._tag(), self.clock.now_s()
            self._submit(k, block_bytes, tag)
            out.append(self._landed(tag) - t0)
        return out

    def close(self) -> None:
        super().close()
        self.initiator.close()


class MooncakePath(_ArbiterPath):
    """Mooncake Transfer Engine: `MooncakeSpanWrite` per block through the link (each chunk one
    synchronous batch write), as `MooncakePeers` moves KV; `breakdown` times its calls without the link."""

    name = "mooncake"

    def __init__(self, target: TargetChild, src: np.ndarray, chunk_bytes: int) -> None:
        super().__init__(target, src, chunk_bytes)
        self.transfer = MooncakeTransfer.start()
        self.peer = MooncakeAddress.from_text(target.mooncake_address)

    def _submit(self, k: int, b: int) -> Any:
        job = MooncakeSpanWrite(self.transfer, self.peer, self.src, [(k * b, b)], self.target.region, [(k * b, b)])
        return self.arbiter.submit(Lane.KV, b, job)

    def stream(self, block_bytes: int, num_blocks: int) -> float:
        t0 = self.clock.now_s()
        handles = [self._submit(k, block_bytes) for k in range(num_blocks)]
        for h in handles:
            h.wait(timeout_s=self.target.timeout_s)
        return self.clock.now_s() - t0

    def each(self, block_bytes: int, num_blocks: int) -> list[float]:
        return seconds_each(self.clock, lambda k: self._submit(k, block_bytes).wait(timeout_s=self.target.timeout_s),
                            num_blocks)

    def breakdown(self, block_bytes: int, num_blocks: int) -> dict[str, float]:
        """Seconds to move the same blocks by Mooncake's calls alone (no link): one synchronous
        write per block (`sync_per_block_s`), and every block in one batch (`one_batch_s`)."""
        base, seg = address_of(self.src), self.target.region.segment
        pieces = [(base + k * block_bytes, seg, k * block_bytes, block_bytes) for k in range(num_blocks)]
        t0 = self.clock.now_s()
        for p in pieces:
            self.transfer.write(self.peer, [p])
        t1 = self.clock.now_s()
        self.transfer.write(self.peer, pieces)
        return {"sync_per_block_s": t1 - t0, "one_batch_s": self.clock.now_s() - t1}

    def close(self) -> None:
        super().close()
        self.transfer.close()
