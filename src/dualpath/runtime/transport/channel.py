"""Control channels between processes on one host: ZeroMQ PUSH/PULL over ipc:// sockets.

Each process binds one `Inbox` (PULL) at an endpoint in a shared temporary directory and keeps an
`Outbox` (PUSH) per peer it talks to. Messages are the registered dataclasses of `messages`.
PUSH/PULL keeps per-sender order; there is no reply socket: a request names its `reply_to` inbox.
Between hosts the same sockets take tcp:// endpoints; set `zmq.TOS` from `tcp.lane_socket_options`
to give them a lane.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import zmq

from .messages import decode, encode

_MAX_IPC_PATH = 100  # sun_path holds 107 bytes on Linux; keep a margin


def ipc_endpoint(directory: str | Path, name: str) -> str:
    """`ipc://` endpoint for the socket file `name` in `directory` (e.g. a TemporaryDirectory)."""
    path = str(Path(directory) / f"{name}.ipc")
    if len(path) > _MAX_IPC_PATH:
        raise ValueError(f"ipc socket path too long ({len(path)} > {_MAX_IPC_PATH} bytes): {path}")
    return f"ipc://{path}"


class Inbox:
    """Bound PULL socket; use from one thread."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._sock = zmq.Context.instance().socket(zmq.PULL)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(endpoint)

    def recv(self, timeout_s: float | None = None) -> Any | None:
        """The next message, or None if none arrives within `timeout_s` (None = wait forever)."""
        if timeout_s is not None and not self._sock.poll(max(0, round(timeout_s * 1000))):
            return None
        return decode(self._sock.recv(copy=True))

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> "Inbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Outbox:
    """Connected PUSH socket; `send` is thread-safe (a link's thread sends completions)."""

    def __init__(self, endpoint: str, linger_s: float = 1.0) -> None:
        self.endpoint = endpoint
        self._lock = threading.Lock()
        self._sock = zmq.Context.instance().socket(zmq.PUSH)
        self._sock.setsockopt(zmq.LINGER, round(linger_s * 1000))  # queued messages flush on close
        self._sock.connect(endpoint)

    def send(self, msg: Any) -> None:
        data = encode(msg)
        with self._lock:
            self._sock.send(data)

    def close(self) -> None:
        with self._lock:
            self._sock.close()

    def __enter__(self) -> "Outbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
