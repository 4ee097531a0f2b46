"""The sending side of remote writes: one marked TCP connection per lane to one `WriteTarget`.

The stand-in for an RDMA queue pair per lane (the lane is the QP's service level on InfiniBand,
its traffic class on RoCE: tcp.py). Lifecycle:

1. `WriteInitiator(host, port, token)` opens one socket per lane, marks it with
   `tcp.apply_lane_options` before connect (so the SYN already carries the DSCP), and answers the
   target's challenge (wire.py). A refused handshake raises `PeerRefused`.
2. `write(lane, segment, offset, src)` / `write_many(lane, segment, pieces)` send WRITE frames:
   the headers and the caller's buffer views go out in one scatter-gather `sendmsg`, so the
   payload is never copied in user space. Like an RDMA WRITE, a return means "handed to the
   kernel", not "landed": the receiver learns that from the IMM that follows.
3. `immediate(lane, message)` sends an IMM on the same stream: the target delivers it only after
   every earlier WRITE of that lane has landed.
4. A send that fails, or makes no progress for `send_timeout_s` (a frozen peer), breaks its lane
   (the frame boundary is lost): later calls on that lane raise `RemoteWriteError` at once; the
   other lane is unaffected. `close()` closes both.

Each lane has its own lock: one thread at a time writes a lane's stream (a frame is never
interleaved with another), while the two lanes proceed in parallel.
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from ....core.lanes import Lane
from ..tcp import open_lane_socket
from .wire import (
    ACCEPT, CHALLENGE, HANDSHAKE_TIMEOUT_S, HELLO, MAC_BYTES, MAGIC, MAX_IMM_BYTES, MAX_SEGMENT_NAME_BYTES,
    MAX_WRITE_FRAME_BYTES, PROTOCOL_VERSION, PeerRefused, RemoteWriteError, hello_mac, imm_header, recv_exact,
    sendmsg_all, write_header,
)

BOTH_LANES = (Lane.LATENCY_CRITICAL, Lane.KV)
# A send that makes no progress this long breaks its lane instead of blocking the caller (a
# LinkArbiter's thread) for ever: twice RuntimeConfig.faults.heartbeat_timeout_s's default of
# 5 s, by when the router has fenced a frozen or dead peer. None blocks without limit.
SEND_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class InitiatorStats:
    """An initiator's counters, by lane (Lane value order)."""

    sent_bytes: tuple[int, int]  # WRITE payload bytes handed to the kernel
    write_frames: tuple[int, int]
    imm_frames: tuple[int, int]


def byte_view(src: Any) -> memoryview:
    """A flat byte view of a host buffer (numpy array of any dtype, bytes, memoryview, a CPU torch
    tensor) without copying it. Device memory is refused: stage it in a host buffer first."""
    if type(src).__module__.startswith("torch"):
        if src.device.type != "cpu":
            raise TypeError(f"remote writes send host memory; got a tensor on {src.device}")
        src = src.numpy()
    view = memoryview(src)
    if not view.c_contiguous:
        raise ValueError("remote writes need a C-contiguous source buffer")
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


class _LaneConn:
    __slots__ = ("sock", "lock", "broken", "sent", "writes", "imms")

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.lock = sock, threading.Lock()
        self.broken: str | None = None
        self.sent = self.writes = self.imms = 0


class WriteInitiator:
    """Connections to one target, one per lane in `lanes`."""

    def __init__(self, host: str, port: int, token: bytes | None = None, lanes: Iterable[Lane] = BOTH_LANES,
                 connect_timeout_s: float = HANDSHAKE_TIMEOUT_S, send_timeout_s: float | None = SEND_TIMEOUT_S,
                 peer: int = -1, incarnation: int = 0) -> None:
        self.address, self.peer = (host, port), peer  # peer: this sender's engine id, named in the hello
        self.incarnation = incarnation  # which process holds that id (wire.py: a successor's is higher)
        self._token, self._send_timeout_s = token, send_timeout_s
        self._lanes: dict[Lane, _LaneConn] = {}
        try:
            for lane in lanes:
                self._lanes[Lane(lane)] = _LaneConn(self._connect(Lane(lane), connect_timeout_s))
        except BaseException:
            self.close()
            raise

    def lane_socket(self, lane: Lane) -> socket.socket:
        """The lane's connected socket (to read its marks; do not send on it)."""
        return self._conn(lane).sock

    def write(self, lane: Lane, segment: str, offset_bytes: int, src: Any) -> None:
        """Land the bytes of `src` at [offset_bytes, offset_bytes + len) of the target's `segment`."""
        self.write_many(lane, segment, [(offset_bytes, byte_view(src))])

    def write_many(self, lane: Lane, segment: str, pieces: Sequence[tuple[int, memoryview]]) -> None:
        """Several WRITEs into one segment, in order, in as few sendmsg calls as the iovec limit
        allows. Each piece is (destination offset_bytes, byte view); pieces over the frame limit
        are split into several frames."""
        name = segment.encode()
        if not 0 < len(name) <= MAX_SEGMENT_NAME_BYTES:
            raise ValueError(f"segment name must be 1-{MAX_SEGMENT_NAME_BYTES} bytes of UTF-8")
        name_view = memoryview(name)
        iov: list[memoryview] = []
        nbytes = frames = 0
        for offset, view in pieces:
            if offset < 0:
                raise ValueError(f"offset_bytes must be >= 0, got {offset}")
            if view.format != "B" or view.ndim != 1:
                view = byte_view(view)
            for at in range(0, view.nbytes, MAX_WRITE_FRAME_BYTES):
                part = view[at:at + MAX_WRITE_FRAME_BYTES]
                iov += (memoryview(write_header(name, offset + at, part.nbytes)), name_view, part)
                nbytes += part.nbytes
                frames += 1
        if not frames:
            return
        conn = self._conn(lane)
        with conn.lock:
            self._send(lane, conn, iov)
            conn.sent += nbytes
            conn.writes += frames

    def immediate(self, lane: Lane, message: bytes) -> None:
        """Send `message` to the target's on_immediate, after this lane's earlier WRITEs."""
        if len(message) > MAX_IMM_BYTES:
            raise ValueError(f"an immediate message holds at most {MAX_IMM_BYTES} bytes, got {len(message)}")
        conn = self._conn(lane)
        with conn.lock:
            self._send(lane, conn, [memoryview(imm_header(len(message))), memoryview(message)])
            conn.imms += 1

    def stats(self) -> InitiatorStats:
        def pair(attr: str) -> tuple[int, int]:
            vals = [0, 0]
            for lane, conn in self._lanes.items():
                vals[lane] = getattr(conn, attr)
            return (vals[0], vals[1])

        return InitiatorStats(pair("sent"), pair("writes"), pair("imms"))

    def close(self) -> None:
        for conn in self._lanes.values():
            conn.broken = conn.broken or "closed"
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            conn.sock.close()

    def __enter__(self) -> "WriteInitiator":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _conn(self, lane: Lane) -> _LaneConn:
        conn = self._lanes.get(Lane(lane))
        if conn is None:
            raise ValueError(f"this initiator has no {Lane(lane).name} connection")
        return conn

    @staticmethod
    def _send(lane: Lane, conn: _LaneConn, iov: list[memoryview]) -> None:
        if conn.broken is not None:
            raise RemoteWriteError(f"{Lane(lane).name} connection is unusable: {conn.broken}")
        try:
            sendmsg_all(conn.sock, iov)
        except OSError as exc:
            conn.broken = f"{type(exc).__name__}: {exc}"
            raise RemoteWriteError(f"{Lane(lane).name} connection failed: {conn.broken}") from exc

    def _connect(self, lane: Lane, timeout_s: float) -> socket.socket:
        host, port = self.address
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = open_lane_socket(lane, family)  # marked before connect: the SYN carries the DSCP
        try:
            sock.settimeout(timeout_s)
            sock.connect((host, port))
            challenge = bytearray(CHALLENGE.size)
            try:
                recv_exact(sock, memoryview(challenge))
            except (RemoteWriteError, ConnectionResetError) as exc:
                raise PeerRefused(f"{host}:{port} closed the {lane.name} connection before its challenge (full?)") from exc
            magic, version, nonce = CHALLENGE.unpack(challenge)
            if magic != MAGIC or version != PROTOCOL_VERSION:
                raise RemoteWriteError(f"{host}:{port} is not a remote-write target of version {PROTOCOL_VERSION}")
            mac = hello_mac(self._token, nonce, lane, self.peer, self.incarnation) if self._token is not None else bytes(MAC_BYTES)
            sock.sendall(HELLO.pack(MAGIC, PROTOCOL_VERSION, int(lane), int(self._token is not None), mac, self.peer,
                                    self.incarnation))
            reply = bytearray(1)
            try:
                recv_exact(sock, memoryview(reply))
            except (RemoteWriteError, ConnectionResetError) as exc:
                raise PeerRefused(f"{host}:{port} refused the {lane.name} connection (token?)") from exc
            if bytes(reply) != ACCEPT:
                raise RemoteWriteError(f"{host}:{port} answered the hello with {bytes(reply)!r}")
            sock.settimeout(self._send_timeout_s)
        except BaseException:
            sock.close()
            raise
        return sock

