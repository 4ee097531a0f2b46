"""The storage service: BlockStores served over TCP (`dualpath store serve`), what 3FS is to
the paper. Wire format and session: wire.py. The client: remote.py.

One request through the server:

1. A connection thread reads one frame (wire.recv_frame); a bad length closes the connection,
   any other bad frame gets an error reply and the next frame is served.
2. The first frame must be `hello`: the shared token (constant-time compare) when the server
   has one, and the store's identity; the identity picks (or opens) the BlockStore under
   `root/<identity>`, so one service holds several models' stores side by side.
3. `get` looks up the stored prefix, opens those files, says how many follow, then `sendfile`s
   each whole file (header + payload, as on disk); the client verifies every block with
   format.py. A block the client found bad comes back as `verify`, which reads it through the
   store's own checked path, so a corrupt file is quarantined here as in a local store.
4. `put` is the store's own put_many (temp file + rename per block): a server killed mid-put
   leaves only temp files, never a partial block under a block's name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import os
import re
import socket
import socketserver
import threading
from typing import Any, Callable

from dualpath.core.blocks import BlockLayout
from dualpath.netaddr import is_loopback
from dualpath.runtime.store import files
from dualpath.runtime.store.errors import BlockFormatError, PayloadSizeError
from dualpath.runtime.store.store import BlockStore
from dualpath.runtime.store.wire import (
    MAX_FRAME_BYTES, PROTOCOL_VERSION, FrameError, ProtocolError, decode, digests_field, error_reply, field,
    recv_frame, send_frame,
)

MAX_STORES = 16  # distinct (model, dtype, layout) stores per service; more is a hostile client
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


class _Unauthorized(Exception):
    pass




def store_dir_name(fingerprint: str, dtype: str, layout: BlockLayout) -> str:
    """The directory of one identity's store: readable, and unique through a digest suffix."""
    key = f"{fingerprint}\0{dtype}\0{layout.num_layers}x{layout.block_tokens}x{layout.kv_bytes_per_token_per_layer}"
    tag = hashlib.sha256(key.encode()).hexdigest()[:12]
    return f"{_SAFE.sub('_', fingerprint)[:64]}-{_SAFE.sub('_', dtype)}-{tag}"


class StoreService:
    """The server's state: its root, token and open stores. `serve_connection` runs one client."""

    def __init__(self, root: str, token: bytes | None = None, capacity_bytes: int | None = None,
                 num_threads: int = 4, store_class: Callable[..., BlockStore] = BlockStore) -> None:
        self.root, self._token = os.fspath(root), token
        self._capacity_bytes, self._num_threads, self._store_class = capacity_bytes, num_threads, store_class
        self._stores: dict[str, BlockStore] = {}
        self._lock = threading.Lock()
        self.served_blocks = 0
        os.makedirs(self.root, exist_ok=True)

    def open_store(self, fingerprint: str, dtype: str, layout: BlockLayout) -> BlockStore:
        name = store_dir_name(fingerprint, dtype, layout)
        with self._lock:
            store = self._stores.get(name)
            if store is None:
                if len(self._stores) >= MAX_STORES:
                    raise ProtocolError(f"this service already holds {MAX_STORES} stores")
                store = self._store_class(os.path.join(self.root, name), layout, fingerprint, dtype,
                                          capacity_bytes=self._capacity_bytes, num_threads=self._num_threads)
                self._stores[name] = store
            return store

    def serve_connection(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        store: BlockStore | None = None
        while True:
            try:
                body = recv_frame(sock)
            except (FrameError, OSError):
                return
            if body is None:
                return
            try:
                message = decode(body)
                op = field(message, "op", str)
                if op == "hello":
                    store = self._hello(message)
                    reply: dict = {"ok": True, "file_bytes": store.file_bytes, "version": PROTOCOL_VERSION}
                elif store is None:
                    raise ProtocolError("the first frame must be hello")
                elif op == "get":
                    digests = digests_field(message)
                    try:
                        self._get(sock, store, digests)
                    except OSError:  # mid-stream, the frame boundary is lost: hang up
                        return
                    continue
                else:
                    reply = self._handle(store, op, message)
            except _Unauthorized as exc:
                _send_quietly(sock, error_reply("unauthorized", str(exc)))
                return
            except (ProtocolError, PayloadSizeError, BlockFormatError, ValueError) as exc:
                reply = error_reply("bad_request", str(exc))
            except OSError as exc:
                reply = error_reply("io_error", f"{type(exc).__name__}: {exc}")
            if not _send_quietly(sock, reply):
                return

    def _hello(self, message: dict) -> BlockStore:
        if self._token is not None:
            given = message.get("token")
            given = given.encode() if isinstance(given, str) else given
            if not isinstance(given, bytes) or not hmac.compare_digest(given, self._token):
                raise _Unauthorized("missing or wrong token")
        if message.get("version") != PROTOCOL_VERSION:
            raise ProtocolError(f"protocol version {message.get('version')!r}, this server speaks {PROTOCOL_VERSION}")
        layout = field(message, "layout", list)
        if len(layout) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) for x in layout):
            raise ProtocolError("layout must be [num_layers, block_tokens, kv_bytes_per_token_per_layer]")
        layout = BlockLayout(*layout)
        if layout.full_block_bytes > MAX_FRAME_BYTES // 2:  # a put of one block must fit a frame
            raise ProtocolError(f"Full Blocks of {layout.full_block_bytes} bytes exceed {MAX_FRAME_BYTES // 2}")
        return self.open_store(field(message, "fingerprint", str), field(message, "dtype", str), layout)

    def _handle(self, store: BlockStore, op: str, message: dict) -> dict:
        if op == "lookup":
            return {"ok": True, "n": store.lookup(digests_field(message))}
        if op == "put":
            items = field(message, "items", list)
            pairs = [_put_item(item) for item in items]
            return {"ok": True, "outcomes": [o.value for o in store.put_many(pairs).outcomes]}
        if op == "verify":
            return {"ok": True, "bad": self._verify(store, digests_field(message))}
        if op == "stats":
            return {"ok": True, "stats": dataclasses.asdict(store.stats()), "served_blocks": self.served_blocks}
        if op == "refresh":
            return {"ok": True, "report": dataclasses.asdict(store.refresh())}
        raise ProtocolError(f"unknown op {op!r}")

    def _get(self, sock: socket.socket, store: BlockStore, digests: list[bytes]) -> None:
        """Reply with the stored prefix's count, then sendfile each whole block file. Files are
        opened before the count is sent, so an eviction meanwhile cannot break the stream."""
        fds: list[int] = []
        try:
            for digest in digests[: store.lookup(digests)]:
                try:
                    fd = os.open(files.block_path(store.root, digest), os.O_RDONLY)
                except OSError:
                    break
                fds.append(fd)
                if os.fstat(fd).st_size != store.file_bytes:
                    fds.pop()
                    os.close(fd)
                    break
            send_frame(sock, {"ok": True, "n": len(fds), "file_bytes": store.file_bytes})
            for fd in fds:
                _sendfile_all(sock, fd, store.file_bytes)
        finally:
            for fd in fds:
                os.close(fd)
        store.touch(digests[: len(fds)])
        with self._lock:
            self.served_blocks += len(fds)

    def _verify(self, store: BlockStore, digests: list[bytes]) -> int:
        """Re-read blocks a client found bad through the store's checked path (a corrupt file
        leaves the index and is quarantined); the number that failed here too."""
        scratch = bytearray(store.layout.full_block_bytes)
        return sum(store.read_into([d], scratch) != 1 for d in digests)

    def close(self) -> None:
        with self._lock:
            stores, self._stores = list(self._stores.values()), {}
        for store in stores:
            store.close()


def _send_quietly(sock: socket.socket, reply: dict) -> bool:
    """Send a reply; False if the client has gone (its thread then ends without a traceback)."""
    try:
        send_frame(sock, reply)
    except OSError:
        return False
    return True


def _put_item(item: Any) -> tuple[bytes, bytes]:
    if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], bytes) and isinstance(item[1], bytes)):
        raise ProtocolError("each put item must be [digest bin, payload bin]")
    return item[0], item[1]


def _sendfile_all(sock: socket.socket, fd: int, count: int) -> None:
    offset = 0
    while offset < count:
        sent = os.sendfile(sock.fileno(), fd, offset, count - offset)
        if sent == 0:
            raise ConnectionError("file shrank while being served")
        offset += sent


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.server.service.serve_connection(self.request)  # type: ignore[attr-defined]


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True


class ServiceHandle:
    """A running service: `address` is the bound (host, port); `close()` stops it."""

    def __init__(self, service: StoreService, server: _Server, thread: threading.Thread) -> None:
        self.service, self._server, self._thread = service, server, thread
        self.address: tuple[str, int] = server.server_address[:2]

    @property
    def url(self) -> str:
        return f"tcp://{self.address[0]}:{self.address[1]}"

    def serve_forever(self) -> None:
        self._thread.join()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self.service.close()


def start_service(root: str, host: str, port: int, token: bytes | None = None, **service_kw: Any) -> ServiceHandle:
    """Bind and serve on a background thread. Beyond loopback a token is required."""
    if token is None and not is_loopback(host):
        raise ValueError(f"listening on {host} (not loopback) needs a shared token (--token-file)")
    service = StoreService(root, token, **service_kw)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class = type("_Server6", (_Server,), {"address_family": family})
    server = server_class((host, port), _Handler)
    server.service = service  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, name="kvstore-service", daemon=True)
    thread.start()
    return ServiceHandle(service, server, thread)
