"""The receiving side of remote writes: registered memory regions that peers write into over TCP.

The stand-in for an RDMA NIC's receive side. Lifecycle of one peer connection:

1. The target's accept thread takes the connection and starts its receiver thread (at most
   `max_connections` at a time; beyond that the connection is refused and counted).
2. Handshake (wire.py): challenge with a fresh nonce, the peer's hello naming its lane, checked
   against the shared token in constant time; then the accepted socket is marked for that lane
   (tcp.apply_lane_options: Linux does not copy SO_PRIORITY to accepted sockets) and acknowledged.
3. Frames, one at a time, in stream order: a WRITE is bounds-checked against its registered
   region and then received with `recv_into` straight into it (no intermediate bytes object);
   an IMM is read and handed to `on_immediate(lane, message)` on this thread. Because one
   thread reads one TCP stream in order, an IMM is delivered only after every earlier WRITE on
   its connection has fully landed: the RDMA-WRITE-with-immediate ordering guarantee.
4. A frame that breaks the rules (unknown segment, out-of-range offset or length, a bad kind,
   a size over the limits, a malformed header) closes that connection with a logged reason and a
   count; nothing outside a registered region is ever written, and other connections go on.
   A peer that vanishes mid-WRITE leaves that WRITE's range partly written, as an RDMA WRITE
   without its completion: the receiver trusts a range only after the IMM that follows it.
5. `close()` stops accepting, shuts every connection down and joins the threads.

Memory stays valid while it is written: a receiver holds its own reference to the region's
array for the length of a WRITE, so `unregister` during a write never frees memory under it.
"""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ....core.lanes import Lane
from ....netaddr import is_loopback
from ..shm import HostBuffer, ShmRegion
from ..tcp import apply_lane_options
from .wire import (
    ACCEPT, CHALLENGE, HANDSHAKE_TIMEOUT_S, HEADER, HELLO, KIND_IMM, KIND_WRITE, MAC_BYTES, MAGIC, MAX_IMM_BYTES,
    MAX_WRITE_FRAME_BYTES, NONCE_BYTES, PROTOCOL_VERSION, RemoteWriteError, hello_mac, recv_exact,
)

log = logging.getLogger(__name__)

# Peer connections served at once (one thread each). 64: two lanes for each of 32 peer engines,
# more than a node's 8 GPUs' engines times its peers in any preset; beyond it a peer is hostile.
MAX_CONNECTIONS = 64
_ACCEPT_POLL_S = 0.2  # the accept loop also wakes this often to see close(), where shutdown does not wake it

OnImmediate = Callable[[Lane, bytes], None]


class BadFrame(Exception):
    """A frame that breaks the protocol; its connection is closed."""


class Refused(Exception):
    """A handshake that failed: the connection is closed before any frame is read. `lane` is the
    lane the hello named, None if it never got that far."""

    def __init__(self, reason: str, lane: Lane | None = None) -> None:
        super().__init__(reason)
        self.lane = lane


@dataclass(frozen=True, slots=True)
class TargetStats:
    """A target's counters, by lane (Lane value order)."""

    written_bytes: tuple[int, int]  # payload bytes landed by WRITE frames
    write_frames: tuple[int, int]
    imm_frames: tuple[int, int]
    refused_connections: tuple[int, int]  # handshakes that named this lane and failed the token check
    bad_frames: tuple[int, int]  # connections closed for a frame that broke the protocol
    refused_unidentified: int  # handshakes refused before a lane was known (garbage, timeout, full)
    open_connections: int


@dataclass(frozen=True, slots=True)
class ConnectionMarks:
    """What the kernel holds for one accepted connection's lane marks (getsockopt)."""

    lane: Lane
    ip_tos: int
    so_priority: int | None


class _Counters:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.written, self.writes, self.imms, self.refused, self.bad = ([0, 0] for _ in range(5))
        self.refused_unidentified = 0


class WriteTarget:
    """Registered regions and a listening socket; one receiver thread per accepted connection."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: bytes | None = None,
                 on_immediate: OnImmediate | None = None, max_connections: int = MAX_CONNECTIONS,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S) -> None:
        if token is None and not is_loopback(host):
            raise ValueError(f"a remote-write target on {host} (not loopback) needs a shared token")
        if token is not None and not token:
            raise ValueError("the shared token is empty")
        self._token, self._on_immediate = token, on_immediate
        self._max_connections, self._handshake_timeout_s = max_connections, handshake_timeout_s
        self._regions: dict[str, memoryview] = {}
        self._arrays: dict[str, np.ndarray] = {}  # keeps the registered memory alive
        self._lock = threading.Lock()
        self._conns: dict[socket.socket, Lane | None] = {}
        self._peer_of: dict[socket.socket, tuple[int, int]] = {}  # (engine id, incarnation) each hello named
        self._fenced: dict[int, int] = {}  # engine id -> its last incarnation the router fenced: that and earlier are refused
        self._threads: set[threading.Thread] = set()
        self._counters = _Counters()
        self._closing = threading.Event()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(max_connections)
            self._listener.settimeout(_ACCEPT_POLL_S)
        except OSError:
            self._listener.close()
            raise
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._acceptor = threading.Thread(target=self._accept_loop, name="rw-accept", daemon=True)
        self._acceptor.start()

    # --- memory registration ---------------------------------------------------------------
    def register(self, name: str, array: np.ndarray) -> None:
        """Expose `array` (a writable, C-contiguous uint8 array: a host buffer, a landing zone)
        to peers as segment `name`."""
        encoded = name.encode()
        if not 0 < len(encoded) <= 255:
            raise ValueError(f"segment name must be 1-255 bytes of UTF-8, got {len(encoded)}")
        if array.dtype != np.uint8 or array.ndim != 1 or not array.flags.c_contiguous or not array.flags.writeable:
            raise ValueError("a registered region must be a writable, C-contiguous 1-D uint8 array")
        with self._lock:
            if name in self._regions:
                raise ValueError(f"segment {name!r} is already registered")
            self._arrays[name], self._regions[name] = array, array.data  # a memoryview of its bytes

    def register_buffer(self, buf: HostBuffer) -> None:
        """Expose a whole host buffer under its segment name (as SharedSegments addresses it)."""
        self.register(buf.name, buf.view(ShmRegion(buf.name, 0, buf.slot_bytes * buf.num_slots)))

    def unregister(self, name: str) -> None:
        with self._lock:
            self._regions.pop(name)
            self._arrays.pop(name)

    # --- state -----------------------------------------------------------------------------
    def stats(self) -> TargetStats:
        with self._lock:
            num_open = len(self._conns)
        c = self._counters
        with c.lock:
            return TargetStats(_pair(c.written), _pair(c.writes), _pair(c.imms), _pair(c.refused), _pair(c.bad),
                               c.refused_unidentified, num_open)

    def connection_marks(self) -> list[ConnectionMarks]:
        """The lane marks the kernel holds for every connection past its handshake."""
        with self._lock:
            conns = [(s, lane) for s, lane in self._conns.items() if lane is not None]
        out = []
        for s, lane in conns:
            try:
                tos = s.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) if s.family == socket.AF_INET else \
                    s.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS)
                prio = s.getsockopt(socket.SOL_SOCKET, socket.SO_PRIORITY) if hasattr(socket, "SO_PRIORITY") else None
            except OSError:  # closed since the snapshot
                continue
            out.append(ConnectionMarks(lane, tos, prio))
        return out

    def fence(self, peer: int, incarnation: int = 0) -> None:
        """Refuse peer `peer`'s `incarnation` (and every earlier one) from now on and cut their
        connections (the router fenced it: a frozen engine that wakes must not write into memory
        that is others' now); a successor the router re-admits under a later incarnation is
        accepted. A frame it was sending may be cut short; what it wrote is never trusted, as no
        immediate of it follows."""
        with self._lock:
            self._fenced[peer] = max(incarnation, self._fenced.get(peer, incarnation))
            cut = [s for s, (p, k) in self._peer_of.items() if p == peer and k <= self._fenced[peer]]
        for s in cut:
            try:
                s.shutdown(socket.SHUT_RDWR)  # its receiver thread ends out of recv_into
            except OSError:
                pass

    def close(self) -> None:
        self._closing.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() at once on Linux
        except OSError:
            pass
        self._acceptor.join()
        self._listener.close()
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)  # wakes its receiver thread out of recv_into
            except OSError:
                pass
        for t in threads:
            t.join()

    def __enter__(self) -> "WriteTarget":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- threads ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                sock, peer = self._listener.accept()
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                if self._closing.is_set():
                    return
                log.exception("remote-write target: accept failed")
                self._closing.wait(_ACCEPT_POLL_S)  # e.g. out of file descriptors: do not spin
                continue
            with self._lock:
                full = len(self._conns) >= self._max_connections
                if not full:
                    self._conns[sock] = None
            if full:
                log.warning("remote-write target: refused %s: %d connections open", peer, self._max_connections)
                self._count_refused(None)
                sock.close()
                continue
            t = threading.Thread(target=self._serve, args=(sock, peer), name=f"rw-recv-{peer[1]}", daemon=True)
            with self._lock:
                self._threads.add(t)
            t.start()

    def _serve(self, sock: socket.socket, peer: tuple) -> None:
        lane: Lane | None = None
        try:
            lane = self._handshake(sock)
            self._frames(sock, lane)
        except Refused as exc:
            log.warning("remote-write target: refused %s: %s", peer, exc)
            self._count_refused(exc.lane)
        except BadFrame as exc:
            log.warning("remote-write target: closed %s (%s lane): %s", peer, lane.name if lane is not None else "?", exc)
            assert lane is not None
            with self._counters.lock:
                self._counters.bad[lane] += 1
        except OSError:  # the peer went away, or close() shut the socket down
            pass
        finally:
            sock.close()
            with self._lock:
                self._conns.pop(sock, None)
                self._peer_of.pop(sock, None)
                self._threads.discard(threading.current_thread())

    def _handshake(self, sock: socket.socket) -> Lane:
        sock.settimeout(self._handshake_timeout_s)
        nonce = os.urandom(NONCE_BYTES)
        try:
            sock.sendall(CHALLENGE.pack(MAGIC, PROTOCOL_VERSION, nonce))
            hello = bytearray(HELLO.size)
            recv_exact(sock, memoryview(hello))
        except (OSError, RemoteWriteError) as exc:
            raise Refused(f"no hello ({type(exc).__name__}: {exc})") from exc
        magic, version, lane_byte, has_mac, mac, peer, incarnation = HELLO.unpack(hello)
        if magic != MAGIC or version != PROTOCOL_VERSION or lane_byte not in (0, 1) or has_mac not in (0, 1):
            raise Refused("malformed hello")
        lane = Lane(lane_byte)
        if self._token is not None:
            if not has_mac or len(mac) != MAC_BYTES:
                raise Refused("no token given", lane)
            if not hmac.compare_digest(mac, hello_mac(self._token, nonce, lane, peer, incarnation)):
                raise Refused("wrong token", lane)
        if incarnation <= self._fenced.get(peer, -1):
            raise Refused(f"peer {peer} (incarnation {incarnation}) is fenced", lane)
        apply_lane_options(sock, lane)
        with self._lock:  # before ACCEPT: once the peer is connected, its lane is known here
            self._conns[sock] = lane
            self._peer_of[sock] = (peer, incarnation)
        sock.sendall(ACCEPT)
        sock.settimeout(None)
        return lane

    def _frames(self, sock: socket.socket, lane: Lane) -> None:
        header = bytearray(HEADER.size)
        header_view = memoryview(header)
        name_buf = memoryview(bytearray(255))
        c = self._counters
        while True:
            if not recv_exact(sock, header_view, eof_ok=True):
                return
            kind, name_len, reserved, nbytes, offset = HEADER.unpack(header)
            if reserved:
                raise BadFrame(f"reserved header bits set ({reserved:#x})")
            if kind == KIND_WRITE:
                target = self._write_target(sock, name_buf, name_len, offset, nbytes)
                recv_exact(sock, target)
                with c.lock:
                    c.written[lane] += nbytes
                    c.writes[lane] += 1
            elif kind == KIND_IMM:
                if name_len or offset or nbytes > MAX_IMM_BYTES:
                    raise BadFrame(f"IMM with name_len {name_len}, offset {offset}, {nbytes} bytes (max {MAX_IMM_BYTES})")
                message = bytearray(nbytes)
                recv_exact(sock, memoryview(message))
                with c.lock:
                    c.imms[lane] += 1
                self._deliver(lane, bytes(message))
            else:
                raise BadFrame(f"unknown frame kind {kind}")

    def _write_target(self, sock: socket.socket, name_buf: memoryview, name_len: int, offset: int,
                      nbytes: int) -> memoryview:
        """The registered bytes a WRITE header names, after every check; BadFrame otherwise."""
        if not 0 < nbytes <= MAX_WRITE_FRAME_BYTES:
            raise BadFrame(f"WRITE of {nbytes} bytes (must be 1-{MAX_WRITE_FRAME_BYTES})")
        if name_len == 0:
            raise BadFrame("WRITE without a segment name")
        recv_exact(sock, name_buf[:name_len])
        try:
            name = bytes(name_buf[:name_len]).decode()
        except UnicodeDecodeError as exc:
            raise BadFrame("segment name is not UTF-8") from exc
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise BadFrame(f"WRITE to unknown segment {name!r}")
        if offset + nbytes > region.nbytes:
            raise BadFrame(f"WRITE [{offset}, {offset + nbytes}) outside segment {name!r} of {region.nbytes} bytes")
        return region[offset:offset + nbytes]

    def _deliver(self, lane: Lane, message: bytes) -> None:
        if self._on_immediate is None:
            return
        try:
            self._on_immediate(lane, message)
        except Exception:  # the callback's bug must not cut the peer off
            log.exception("remote-write target: on_immediate callback failed")

    def _count_refused(self, lane: Lane | None) -> None:
        with self._counters.lock:
            if lane is None:
                self._counters.refused_unidentified += 1
            else:
                self._counters.refused[lane] += 1


def _pair(xs: list[int]) -> tuple[int, int]:
    return (xs[0], xs[1])
