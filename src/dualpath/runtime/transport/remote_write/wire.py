"""The wire of remote writes: handshake, frame headers, limits, and the exact send/receive loops.

A connection (one per lane) carries, in order:

1. target -> initiator: CHALLENGE = MAGIC, u16 version, a fresh 32-byte nonce.
2. initiator -> target: HELLO = MAGIC, u16 version, u8 lane, u8 has_mac, 32-byte MAC, i32 peer,
   u32 incarnation, where MAC = HMAC-SHA256(token, DOMAIN + nonce + lane byte + peer as i32 +
   incarnation as u32) (zeros and has_mac 0 without a token). `peer` is the sender's engine id
   (-1: none) and `incarnation` which process holds that id (0 first, +1 for each successor the
   router re-admitted after a restart), so a target can refuse a peer the router fenced
   (`WriteTarget.fence`) and still accept its successor; the MAC binds both: a peer cannot claim
   another's id or a later incarnation than the router gave it.
   The target compares in constant time (hmac.compare_digest); a wrong or missing MAC closes the
   connection. The lane is bound into the MAC, so a recorded hello cannot be replayed for the
   other lane, and the nonce is fresh per connection, so it cannot be replayed at all.
3. target -> initiator: ACCEPT (one byte) once the hello checks out. A refused peer sees EOF.
4. initiator -> target, until either side closes: frames. Every frame starts with a 16-byte
   little-endian header (kind u8, name_len u8, reserved u16 = 0, nbytes u32, offset_bytes u64):
   - WRITE: then `name_len` bytes of the segment name (UTF-8), then `nbytes` payload bytes that
     land at [offset_bytes, offset_bytes + nbytes) of that registered segment;
   - IMM: name_len 0, offset 0, then `nbytes` message bytes handed to the target's callback.

Offsets are unsigned on the wire, so "negative" is a huge value and fails the bounds check like
any other out-of-range write.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import struct
from typing import Sequence

from ....core.lanes import Lane

MAGIC = b"DPRW"  # DualPath Remote Write
PROTOCOL_VERSION = 3  # 2: the hello names its peer; 3: and its incarnation
NONCE_BYTES = 32  # 256 bits of os.urandom per connection: never repeats in practice
MAC_BYTES = 32  # HMAC-SHA256 digest size (RFC 2104, FIPS 180-4)
DOMAIN = b"dualpath-remote-write-v1\0"  # separates these MACs from any other use of the token

CHALLENGE = struct.Struct("<4sH32s")
HELLO = struct.Struct("<4sHBB32siI")
ACCEPT = b"\x01"

HEADER = struct.Struct("<BBHIQ")  # kind, name_len, reserved, nbytes, offset_bytes
KIND_WRITE = 1
KIND_IMM = 2

MAX_SEGMENT_NAME_BYTES = 255  # fits name_len's u8; POSIX shm names are far shorter (NAME_MAX)
# One WRITE frame lands at most this much; the initiator splits larger writes. 64 MiB: the
# arbiter's largest run on an unlimited link (arbiter.DEFAULT_MAX_RUN_BYTES), well inside u32.
MAX_WRITE_FRAME_BYTES = 64 * 2**20
# An IMM is a control message (LayerReady, CopyDone: a few hundred bytes of msgpack); 1 MiB
# bounds what a hostile peer can make the target allocate per frame.
MAX_IMM_BYTES = 2**20
# A peer silent this long during the handshake is dropped: the bound RuntimeConfig.store.timeout_s
# (5 s) puts on a storage-service call; a handshake is one round trip, milliseconds on a loaded host.
HANDSHAKE_TIMEOUT_S = 5.0
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024  # iovecs per sendmsg (Linux: 1024)


class RemoteWriteError(ConnectionError):
    """A remote-write connection failed (peer gone, refused, or a protocol violation)."""


class PeerRefused(RemoteWriteError):
    """The target closed the connection during the handshake (wrong or missing token, or full)."""




def hello_mac(token: bytes, nonce: bytes, lane: Lane, peer: int = -1, incarnation: int = 0) -> bytes:
    return hmac.new(token, DOMAIN + nonce + bytes([int(lane)]) + peer.to_bytes(4, "little", signed=True)
                    + incarnation.to_bytes(4, "little"), hashlib.sha256).digest()


def write_header(name: bytes, offset_bytes: int, nbytes: int) -> bytes:
    return HEADER.pack(KIND_WRITE, len(name), 0, nbytes, offset_bytes)


def imm_header(nbytes: int) -> bytes:
    return HEADER.pack(KIND_IMM, 0, 0, nbytes, 0)


def recv_exact(sock: socket.socket, view: memoryview, eof_ok: bool = False) -> bool:
    """Fill `view` from `sock` with recv_into (no intermediate buffer). False on EOF before the
    first byte when `eof_ok` (a clean end between frames); EOF anywhere else raises."""
    got, total = 0, view.nbytes
    while got < total:
        n = sock.recv_into(view[got:], total - got)
        if n == 0:
            if got == 0 and eof_ok:
                return False
            raise RemoteWriteError(f"peer closed after {got} of {total} bytes")
        got += n
    return True


def sendmsg_all(sock: socket.socket, views: Sequence[memoryview]) -> int:
    """Send every byte of `views` in order with scatter-gather sendmsg (the payload views are
    never copied in user space); handles partial sends. Returns the bytes sent."""
    pending = [v for v in views if v.nbytes]
    total = sum(v.nbytes for v in pending)
    while pending:
        sent = sock.sendmsg(pending[:_IOV_MAX])
        i = 0
        while i < len(pending) and sent >= pending[i].nbytes:
            sent -= pending[i].nbytes
            i += 1
        pending = pending[i:]
        if sent:
            pending[0] = pending[0][sent:]
    return total
