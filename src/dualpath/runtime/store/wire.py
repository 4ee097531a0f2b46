"""Wire format of the storage service (service.py serves it, remote.py speaks it).

Every message is one frame: a 4-byte little-endian body length, then a msgpack map. A `get`
reply is the one exception: its frame is followed by a raw tail of `n` whole block files
(header + payload, `file_bytes` each, exactly as on disk), so the server can `sendfile` them
and the client can `recv_into` the caller's buffer: no msgpack copy of KV bytes on the read
path, and the client checks each block with format.py as the local store does.

Why msgpack over length-prefixed TCP and not pyzmq: the read path wants `sendfile` on the
server and `recv_into` a caller's slot on the client, which a plain socket gives and ZeroMQ's
message framing does not (it copies every message into its own buffers); msgpack (already a
dependency) keeps the control fields typed and self-describing.

Session: the client's first frame is `hello` (token, format version, the store's identity:
fingerprint, dtype, layout); the server answers with the store's `file_bytes`. Then any of
`lookup`, `get`, `put`, `verify`, `stats`, `refresh`. Replies are `{"ok": True, ...}` or
`{"ok": False, "error": {"type": ..., "message": ...}}`. A frame whose length is 0 or above
MAX_FRAME_BYTES cannot be skipped safely, so the server closes that connection; any other bad
frame (bad msgpack, unknown op, wrong types, a digest of the wrong length) gets an error reply
and the connection keeps serving.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import msgpack

from dualpath.runtime.store.format import DIGEST_BYTES

PROTOCOL_VERSION = 1
LENGTH = struct.Struct("<I")
# 256 MiB: a put frame of ~80 SmolLM2 float32 blocks (2.9 MiB each); larger puts are split
MAX_FRAME_BYTES = 256 << 20
MAX_DIGESTS_PER_REQUEST = 1 << 16  # a 4M-token prompt in 64-token blocks; more is hostile
_COALESCE_BYTES = 1 << 16  # below this, one copy of the body is cheaper than a second send
OPS = ("hello", "lookup", "get", "put", "verify", "stats", "refresh")


class ProtocolError(ValueError):
    """A frame the peer should not have sent (reported back, connection kept)."""


class FrameError(ConnectionError):
    """A frame boundary that cannot be trusted: the connection must close."""


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill `view` from `sock`; ConnectionError if the peer closes first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def recv_frame(sock: socket.socket) -> bytes | None:
    """One frame's body; None on a clean EOF before a frame starts."""
    head = bytearray(LENGTH.size)
    n = sock.recv_into(head)
    if n == 0:
        return None
    if n < LENGTH.size:
        recv_exact(sock, memoryview(head)[n:])
    (length,) = LENGTH.unpack(head)
    if not 0 < length <= MAX_FRAME_BYTES:
        raise FrameError(f"frame length {length} outside [1, {MAX_FRAME_BYTES}]")
    body = bytearray(length)
    recv_exact(sock, memoryview(body))
    return bytes(body)


def send_frame(sock: socket.socket, message: dict) -> None:
    body = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(body)} bytes exceeds {MAX_FRAME_BYTES}")
    if len(body) < _COALESCE_BYTES:
        sock.sendall(LENGTH.pack(len(body)) + body)
    else:  # no concatenation copy of a large put; TCP_NODELAY is set, so no Nagle stall
        sock.sendall(LENGTH.pack(len(body)))
        sock.sendall(body)


def decode(body: bytes) -> dict:
    """The map in a frame body; ProtocolError for bad msgpack or a non-map."""
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types for garbage
        raise ProtocolError(f"body is not msgpack: {type(exc).__name__}") from exc
    if not isinstance(message, dict):
        raise ProtocolError(f"body is a {type(message).__name__}, expected a map")
    return message


def field(message: dict, name: str, kind: type | tuple[type, ...]) -> Any:
    value = message.get(name)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is int:
        raise ProtocolError(f"field {name!r} must be {getattr(kind, '__name__', kind)}, got {type(value).__name__}")
    return value


def digests_field(message: dict, name: str = "digests") -> list[bytes]:
    digests = field(message, name, list)
    if len(digests) > MAX_DIGESTS_PER_REQUEST:
        raise ProtocolError(f"{len(digests)} digests, at most {MAX_DIGESTS_PER_REQUEST} per request")
    for d in digests:
        if not isinstance(d, bytes) or len(d) != DIGEST_BYTES:
            raise ProtocolError(f"every digest must be {DIGEST_BYTES} bytes of bin")
    return digests


def error_reply(kind: str, message: str) -> dict:
    return {"ok": False, "error": {"type": kind, "message": message}}
