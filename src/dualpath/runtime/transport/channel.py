"""Control channels between processes on one host: ZeroMQ PUSH/PULL over ipc:// sockets.

Each process binds one `Inbox` (PULL) at an endpoint in a shared temporary directory and keeps an
`Outbox` (PUSH) per peer it talks to. Messages are the registered dataclasses of `messages`.
PUSH/PULL keeps per-sender order; there is no reply socket: a request names its `reply_to` inbox.
`Outbox.send_many` sends several messages as one multipart frame, so they arrive together.

Between hosts the same sockets take tcp:// endpoints. They are then marked for the latency-critical
lane (control messages are small and on the critical path: IP_TOS from tcp.py) and, given a shared
token, authenticated both ways (peer_auth.py: CURVE keys derived from it); an endpoint beyond
loopback without a token is refused. A frame that does not decode as a registered message is
dropped and counted (`Inbox.bad_frames`), never raised into the engine's loop. Field types are not
checked: past authentication a peer is one of ours, and a wrong type there is a bug to see.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import zmq

from ...core.lanes import Lane
from .messages import decode, encode
from .peer_auth import endpoint_is_local, secure_client, secure_server
from .tcp import lane_socket_options

log = logging.getLogger(__name__)

_MAX_IPC_PATH = 100  # sun_path holds 107 bytes on Linux; keep a margin


def ipc_endpoint(directory: str | Path, name: str) -> str:
    """`ipc://` endpoint for the socket file `name` in `directory` (e.g. a TemporaryDirectory)."""
    path = str(Path(directory) / f"{name}.ipc")
    if len(path) > _MAX_IPC_PATH:
        raise ValueError(f"ipc socket path too long ({len(path)} > {_MAX_IPC_PATH} bytes): {path}")
    return f"ipc://{path}"


def _prepare(sock: zmq.Socket, endpoint: str, token: bytes | None, server: bool) -> None:
    """Lane marks and authentication for a tcp:// endpoint; ipc:// needs neither."""
    if not endpoint.startswith("tcp://"):
        return
    if token is None and not endpoint_is_local(endpoint):
        raise ValueError(f"{endpoint} is reachable beyond loopback: it needs a shared token (--token-file)")
    sock.setsockopt(zmq.TOS, lane_socket_options(Lane.LATENCY_CRITICAL).ip_tos)
    if token is not None:
        (secure_server if server else secure_client)(sock, token)


class Inbox:
    """Bound PULL socket; use from one thread. `token`: authenticate tcp:// peers (peer_auth.py)."""

    def __init__(self, endpoint: str, token: bytes | None = None) -> None:
        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            _prepare(self._sock, endpoint, token, server=True)
            self._sock.bind(endpoint)
        except Exception:
            self._sock.close()
            raise
        self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT) if endpoint.startswith("tcp://") else endpoint
        self.bad_frames = 0
        self._arrived: deque[Any] = deque()  # the rest of a `send_many`, delivered with its first

    def recv(self, timeout_s: float | None = None) -> Any | None:
        """The next message, or None if none arrives within `timeout_s` (None = wait forever).
        Frames that are not a registered message are dropped (counted in `bad_frames`)."""
        while not self._arrived:
            if timeout_s is not None and not self._sock.poll(max(0, round(timeout_s * 1000))):
                return None
            for data in self._sock.recv_multipart(copy=True):
                try:
                    self._arrived.append(decode(data))
                except Exception as exc:  # msgpack's errors, a wrong field count, an unknown tag: a bad frame
                    self.bad_frames += 1
                    log.warning("%s: dropped a malformed frame of %d bytes (%s)", self.endpoint, len(data), exc)
        return self._arrived.popleft()

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "Inbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Outbox:
    """Connected PUSH socket; `send` is thread-safe (a link's thread sends completions)."""

    def __init__(self, endpoint: str, linger_s: float = 1.0, token: bytes | None = None) -> None:
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self.sent_bytes = 0  # the encoded messages' bytes handed to the socket (ZMQ's frames and TCP/IP not included)
        self._sock = zmq.Context.instance().socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, round(linger_s * 1000))  # queued messages flush on close
        try:
            _prepare(self._sock, endpoint, token, server=False)
            self._sock.connect(endpoint)
        except Exception:
            self._sock.close()
            raise

    def send(self, msg: Any) -> None:
        data = encode(msg)
        with self._lock:
            self._sock.send(data)
            self.sent_bytes += len(data)

    def send_many(self, msgs: list[Any]) -> None:
        """Messages that arrive together, in order (one multipart frame: the receiver's `recv`
        has them all once it has the first), e.g. one scheduling pass's assignments to an engine."""
        if not msgs:
            return
        parts = [encode(m) for m in msgs]
        with self._lock:
            self._sock.send_multipart(parts)
            self.sent_bytes += sum(map(len, parts))

    def close(self) -> None:
        with self._lock:
            self._sock.close()

    def __enter__(self) -> "Outbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SendsTogether:
    """`send` goes out at once, except inside `together()`: then each outbox's messages are held
    and leave as one `send_many` at its end (the router's placement loop: a pass's assignments)."""

    def __init__(self) -> None:
        self._held: dict[Outbox, list[Any]] | None = None

    def send(self, box: Outbox, msg: Any) -> None:
        if self._held is None:
            box.send(msg)
        else:
            self._held.setdefault(box, []).append(msg)

    @contextmanager
    def together(self) -> Iterator[None]:
        held: dict[Outbox, list[Any]] = {}
        self._held = held
        try:
            yield
        finally:
            self._held = None
            for box, msgs in held.items():
                box.send_many(msgs)
