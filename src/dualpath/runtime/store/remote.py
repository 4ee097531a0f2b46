"""RemoteStore: the client of the storage service (service.py), with BlockStore's interface as
the engines and the router use it (lookup, put, put_many, read_into, stats, refresh, close);
`store_for(url, ...)` picks a BlockStore for a directory and a RemoteStore for tcp://HOST:PORT.

One read through the client:

1. A pooled connection (or a new one, which says hello first) sends `get` with the digests.
2. The reply says how many leading blocks follow; each whole file's header lands in a small
   buffer and its payload straight in the caller's slot of `out` (recv_into, no copy).
3. Each block is checked with format.py on a verify thread while the next one arrives: the
   header must parse and name this store's model, layout and digest, and the payload must
   match its CRC32. The first bad block ends the returned prefix (a miss, never used) and is
   reported back (`verify`), so the server quarantines it if its file is corrupt.
4. A pooled connection that fails (e.g. the server restarted) is retried once on a fresh one
   (not one that timed out: a frozen service would cost a second timeout); a service that stays
   unreachable reads as a miss (lookup 0, read_into 0; serving goes on by recomputing) and a put
   raises RemoteStoreError, an OSError, as a full disk does locally.
5. A call that times out or cannot connect (refused) opens a circuit breaker (breaker.py): for
   STORE_RETRY_AFTER_S the calls are skipped at once, then a probe on its own thread decides, so a
   dead or frozen service costs the router's loop and each engine's reader and writer one
   timeout, not one per call. `skipped_calls()` counts them by operation.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Sequence, TypeVar
from urllib.parse import parse_qs, urlsplit

from dualpath.core.blocks import BlockLayout
from dualpath.errors import InputError
from dualpath.runtime.store.breaker import STORE_RETRY_AFTER_S, CircuitBreaker
from dualpath.runtime.store.buffers import block_payload, byte_view
from dualpath.runtime.store.errors import BlockFormatError, ForeignBlockError, OutputBufferError, PayloadChecksumError
from dualpath.runtime.store.format import HEADER_BYTES, parse_header
from dualpath.runtime.store.results import PutOutcome, PutReport, RefreshReport, StoreStats
from dualpath.runtime.store.store import BlockStore
from dualpath.runtime.store.wire import (
    MAX_DIGESTS_PER_REQUEST, MAX_FRAME_BYTES, PROTOCOL_VERSION, ProtocolError, decode, recv_exact,
    recv_frame, send_frame,
)

CONNECT_TIMEOUT_S = 10.0  # a loopback or LAN service answers a connect in well under this
# a large get is split over up to num_streams connections (as the local store reads on its
# thread pool); a stream carries at least this many blocks, so a short hit stays one request
STREAM_MIN_BLOCKS = 4
_PUT_FRAME_SLACK_BYTES = 1 << 20  # msgpack overhead of a put frame is far below 1 MiB
_T = TypeVar("_T")


class RemoteStoreError(ConnectionError):
    """The storage service refused a request or could not be reached."""


class ServiceUnreachable(RemoteStoreError):
    """A connection to the service could not be made (refused, no route, connect timed out)."""


class ServiceSkipped(RemoteStoreError):
    """Not sent: the breaker is open after a call timed out or could not connect."""


@dataclasses.dataclass(frozen=True, slots=True)
class StoreAddress:
    host: str
    port: int
    token_file: str | None


def parse_store_url(url: str) -> StoreAddress:
    """tcp://HOST:PORT[?token_file=PATH] (IPv6 hosts in brackets)."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError as exc:
        raise InputError(f"store URL {url!r}: {exc}") from exc
    if parts.scheme != "tcp" or not parts.hostname or port is None or parts.path not in ("", "/"):
        raise InputError(f"store URL {url!r} must be tcp://HOST:PORT[?token_file=PATH]")
    query = parse_qs(parts.query)
    unknown = set(query) - {"token_file"}
    if unknown:
        raise InputError(f"store URL {url!r}: unknown parameter(s) {sorted(unknown)}")
    token_file = query.get("token_file", [None])[-1]
    return StoreAddress(parts.hostname, port, token_file)


def read_token(path: str) -> bytes:
    """The shared token in `path` (surrounding whitespace stripped); InputError if unreadable or empty."""
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as exc:
        raise InputError(f"token file {path}: {exc.strerror or exc}") from exc
    if not token:
        raise InputError(f"token file {path} is empty")
    return token


def store_for(url: str, layout: BlockLayout, fingerprint: str, dtype: str, *,
              capacity_bytes: int | None = None, num_threads: int = 4, direct_io: bool = False,
              timeout_s: float | None = None) -> "BlockStore | RemoteStore":
    """A BlockStore for a directory, a RemoteStore for tcp://HOST:PORT (whose capacity is the
    server's --capacity-bytes; `capacity_bytes` then does not apply). A malformed URL, a bad
    token file or a service that does not answer is an InputError naming the URL."""
    if url.startswith("tcp://"):
        addr = parse_store_url(url)
        token = read_token(addr.token_file) if addr.token_file else None
        try:
            return RemoteStore(addr.host, addr.port, layout, fingerprint, dtype, token=token, url=url,
                               num_streams=num_threads, timeout_s=timeout_s)
        except RemoteStoreError as exc:
            raise InputError(f"store {url}: {exc}") from exc
    if "://" in url:
        raise InputError(f"store {url!r}: a directory or tcp://HOST:PORT")
    return BlockStore(url, layout, fingerprint, dtype, capacity_bytes=capacity_bytes, num_threads=num_threads,
                      direct_io=direct_io)


class RemoteStore:
    """Thread-safe client of one store on a storage service; see the module docstring."""

    def __init__(self, host: str, port: int, layout: BlockLayout, fingerprint: str, dtype: str, *,
                 token: bytes | None = None, timeout_s: float | None = None, url: str | None = None,
                 num_streams: int = 4, retry_after_s: float = STORE_RETRY_AFTER_S) -> None:
        self.root = url or f"tcp://{host}:{port}"  # what engines are told to open
        self.layout, self.fingerprint, self.dtype = layout, fingerprint, dtype
        self.file_bytes = HEADER_BYTES + layout.full_block_bytes
        self._address, self._token, self._timeout_s = (host, port), token, timeout_s
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(("hit_blocks", "miss_blocks", "checksum_failures", "header_failures",
                                      "service_errors"), 0)
        if num_streams < 1:
            raise ValueError(f"num_streams must be >= 1, got {num_streams}")
        self._num_streams = num_streams
        self._stream_pool = ThreadPoolExecutor(num_streams, thread_name_prefix="kvstore-remote-get")
        self._verify_pool = ThreadPoolExecutor(num_streams, thread_name_prefix="kvstore-remote-crc")
        self.breaker = CircuitBreaker(lambda: self._call({"op": "stats"}, probe=True), retry_after_s)
        self._with_connection(lambda sock: None)  # fail here, clearly, if the service is not there

    # -- connections -----------------------------------------------------------------------

    def _connect(self) -> socket.socket:
        try:
            sock = socket.create_connection(self._address, timeout=CONNECT_TIMEOUT_S)
        except OSError as exc:
            raise ServiceUnreachable(f"cannot reach the storage service at {self.root}: {exc}") from exc
        sock.settimeout(self._timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            reply = _request(sock, {"op": "hello", "version": PROTOCOL_VERSION, "token": self._token,
                                    "fingerprint": self.fingerprint, "dtype": self.dtype,
                                    "layout": [self.layout.num_layers, self.layout.block_tokens,
                                               self.layout.kv_bytes_per_token_per_layer]})
            if reply.get("file_bytes") != self.file_bytes:
                raise RemoteStoreError(f"service block files are {reply.get('file_bytes')} bytes, expected {self.file_bytes}")
        except BaseException:
            sock.close()
            raise
        return sock

    def _with_connection(self, fn: Callable[[socket.socket], _T], op: str = "call", probe: bool = False) -> _T:
        """Run `fn` on a pooled connection; one that fails is closed, and a pooled one (perhaps
        dead since a server restart) is retried once on a fresh connection unless it timed out.
        ServiceSkipped while the breaker is open (`probe`: the breaker's own call goes through)."""
        if not probe and not self.breaker.allow(op):
            raise ServiceSkipped(f"storage service at {self.root}: skipped, unreachable (retry within {self.breaker.retry_after_s} s)")
        with self._lock:
            sock = self._idle.pop() if self._idle else None
        for attempt in range(2):
            reused = sock is not None
            try:
                if sock is None:
                    sock = self._connect()
                result = fn(sock)
            except (OSError, ProtocolError) as exc:
                if sock is not None:
                    sock.close()
                sock = None
                if reused and attempt == 0 and not isinstance(exc, TimeoutError):
                    continue
                if isinstance(exc, (TimeoutError, ServiceUnreachable)):
                    self.breaker.failed()  # frozen or gone (a reset alone is not: a restart reconnects)
                if isinstance(exc, RemoteStoreError):
                    raise
                raise RemoteStoreError(f"storage service at {self.root}: {type(exc).__name__}: {exc}") from exc
            except BaseException:
                if sock is not None:
                    sock.close()
                raise
            with self._lock:
                self._idle.append(sock)
            return result
        raise AssertionError("unreachable")

    def _call(self, message: dict, probe: bool = False) -> dict:
        return self._with_connection(lambda sock: _request(sock, message), message["op"], probe)

    # -- the store interface ---------------------------------------------------------------

    def lookup(self, digests: Sequence[bytes]) -> int:
        """Number of leading `digests` the service holds; 0 if it cannot be reached."""
        digests = [bytes(d) for d in digests][:MAX_DIGESTS_PER_REQUEST]
        if not digests:
            return 0
        try:
            return int(self._call({"op": "lookup", "digests": digests})["n"])
        except ServiceSkipped:
            return 0
        except OSError:
            self._count("service_errors", 1)
            return 0

    def put(self, digest: bytes, payload: Any) -> PutOutcome:
        return self.put_many([(digest, payload)]).outcomes[0]

    def put_many(self, items: Iterable[tuple[bytes, Any]]) -> PutReport:
        """Store blocks on the service (its put: temp file + rename each); raises RemoteStoreError."""
        checked = [(bytes(d), block_payload(d, p, self.layout)) for d, p in items]
        per_frame = max(1, (MAX_FRAME_BYTES - _PUT_FRAME_SLACK_BYTES) // self.layout.full_block_bytes)
        outcomes: list[PutOutcome] = []
        for start in range(0, len(checked), per_frame):
            chunk = checked[start : start + per_frame]
            reply = self._call({"op": "put", "items": [[d, v] for d, v in chunk]})
            outcomes += [PutOutcome(o) for o in reply["outcomes"]]
        return PutReport(tuple(d for d, _ in checked), tuple(outcomes))

    def read_into(self, digests: Sequence[bytes], out: Any) -> int:
        """Read the service's stored prefix of `digests` into `out` (block i at byte
        i * full_block_bytes); the number of leading blocks that arrived and passed every
        check. A service that cannot be reached reads as 0 blocks."""
        digests = [bytes(d) for d in digests]
        mv = byte_view(out, writable=True)
        block_bytes = self.layout.full_block_bytes
        if len(mv) < len(digests) * block_bytes:
            raise OutputBufferError(f"buffer has {len(mv)} bytes, {len(digests)} blocks need "
                                    f"{len(digests) * block_bytes}")
        if not digests:
            return 0
        digests = digests[:MAX_DIGESTS_PER_REQUEST]
        step = max(STREAM_MIN_BLOCKS, -(-len(digests) // self._num_streams))
        starts = range(0, len(digests), step)
        chunks = list(self._stream_pool.map(lambda i: self._get_chunk(digests[i : i + step], mv[i * block_bytes :]), starts))
        num_ok = 0
        for start, got in zip(starts, chunks):  # the hit is the prefix up to the first gap or bad block
            ok = next((i for i, e in enumerate(got) if e is not None), len(got))
            num_ok += ok
            if ok < len(digests[start : start + step]):
                break
        errors = [e for got in chunks for e in got]
        bad = [d for start, got in zip(starts, chunks) for d, e in zip(digests[start:], got) if e is not None]
        self._count("hit_blocks", num_ok)
        self._count("miss_blocks", len(digests) - num_ok)
        self._count("checksum_failures", sum(isinstance(e, PayloadChecksumError) for e in errors))
        self._count("header_failures", sum(e is not None and not isinstance(e, PayloadChecksumError) for e in errors))
        if bad:
            try:
                self._call({"op": "verify", "digests": bad})
            except OSError:
                self._count("service_errors", 1)
        return num_ok

    def _get_chunk(self, digests: list[bytes], mv: memoryview) -> list[Exception | None]:
        """One stream's blocks: an outcome per leading block the service sent ([] if unreachable)."""
        try:
            return self._with_connection(lambda sock: self._get(sock, digests, mv), "get")
        except ServiceSkipped:
            return []
        except OSError:
            self._count("service_errors", 1)
            return []

    def _get(self, sock: socket.socket, digests: list[bytes], mv: memoryview) -> list[Exception | None]:
        send_frame(sock, {"op": "get", "digests": digests})
        reply = _reply(sock)
        n, block_bytes = reply.get("n"), self.layout.full_block_bytes
        if not isinstance(n, int) or not 0 <= n <= len(digests) or reply.get("file_bytes") != self.file_bytes:
            raise ProtocolError(f"bad get reply {reply!r}")
        checks: list[Future] = []
        for i in range(n):
            header = bytearray(HEADER_BYTES)
            recv_exact(sock, memoryview(header))
            dest = mv[i * block_bytes : (i + 1) * block_bytes]
            recv_exact(sock, dest)
            checks.append(self._verify_pool.submit(self._check, header, digests[i], dest))
        return [f.result() for f in checks]

    def _check(self, header_bytes: bytearray, digest: bytes, payload: memoryview) -> Exception | None:
        try:
            header = parse_header(header_bytes)
            header.check_matches(self.fingerprint, self.dtype, self.layout, digest)
            header.verify_payload(payload)
        except (BlockFormatError, ForeignBlockError) as exc:
            return exc
        return None

    def stats(self) -> StoreStats:
        """The service's block counts, this client's read counters (hits, misses, failures)."""
        remote = self._call({"op": "stats"})["stats"]
        with self._lock:
            mine = dict(self._counts)
        return StoreStats(remote["num_blocks"], remote["used_bytes"], remote["capacity_bytes"],
                          mine["hit_blocks"], mine["miss_blocks"], remote["written_blocks"],
                          remote["evicted_blocks"], mine["checksum_failures"], mine["header_failures"],
                          remote["quarantined_blocks"], 0, read_errors=remote.get("read_errors", 0),
                          write_failures=remote.get("write_failures", 0), service_errors=mine["service_errors"])

    def skipped_calls(self) -> dict[str, int]:
        """Calls the breaker answered without the service since this client opened, by operation
        (lookup, get, put, verify, stats, refresh)."""
        return dict(self.breaker.skipped)

    def refresh(self) -> RefreshReport:
        return RefreshReport(**self._call({"op": "refresh"})["report"])

    def _count(self, key: str, n: int) -> None:
        with self._lock:
            self._counts[key] += n

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            sock.close()
        self._stream_pool.shutdown(wait=True)
        self._verify_pool.shutdown(wait=True)

    def __enter__(self) -> "RemoteStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _reply(sock: socket.socket) -> dict:
    body = recv_frame(sock)
    if body is None:
        raise ConnectionError("the storage service closed the connection")
    reply = decode(body)
    if reply.get("ok") is not True:
        error = reply.get("error") or {}
        raise RemoteStoreError(f"storage service: {error.get('type')}: {error.get('message')}")
    return reply


def _request(sock: socket.socket, message: dict) -> dict:
    send_frame(sock, message)
    return _reply(sock)
