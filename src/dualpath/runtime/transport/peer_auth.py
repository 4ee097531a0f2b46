"""Who may talk to an engine or the router across hosts: ZeroMQ CURVE keys derived from a shared token.

On one host the control channels are ipc:// sockets in a private directory (mode 0700), so only
this user's processes reach them. Beyond loopback a tcp:// channel must authenticate its peers
(tests/runtime/transport/test_channel_auth.py): every process of a deployment is given the
same token file, as the storage service is (store/service.py), and derives from it

  1. the server key pair: a CURVE secret key = SHA-256("dualpath server" || token), its public key
     by curve_public; every Inbox binds with it, so a client that does not know the token cannot
     even finish the handshake against the right server key;
  2. the client key pair, the same way ("dualpath client"); an Outbox presents it;
  3. a ZAP handler (RFC 27, one thread per process on inproc://zeromq.zap.01) that accepts a CURVE
     client only if its public key is the derived client key (hmac.compare_digest) and refuses
     every other mechanism, counting refusals.

CURVE also encrypts, so a token never crosses the wire in any form. What this does not give: per
peer identities or revocation (one token, shared), which a deployment with an identity service
would add in the ZAP handler.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import zmq
from zmq.utils import z85

from ...netaddr import is_loopback

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27 (ZAP)
ZAP_VERSION = b"1.0"
ZAP_POLL_MS = 200  # how often the handler thread looks at its stop flag


@dataclass(frozen=True, slots=True)
class CurveKeys:
    server_public: bytes  # z85, 40 bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def derive_keys(token: bytes) -> CurveKeys:
    if not token:
        raise ValueError("an empty token authenticates nobody")

    def pair(role: bytes) -> tuple[bytes, bytes]:
        secret = z85.encode(hashlib.sha256(b"dualpath " + role + b"\0" + token).digest())
        return zmq.curve_public(secret), secret

    sp, ss = pair(b"server")
    cp, cs = pair(b"client")
    return CurveKeys(sp, ss, cp, cs)


def endpoint_is_local(endpoint: str) -> bool:
    """ipc:// and inproc:// endpoints, and tcp:// ones on a loopback address, stay on this host."""
    scheme = endpoint.split("://", 1)[0]
    if scheme in ("ipc", "inproc"):
        return True
    return is_loopback(urlsplit(endpoint).hostname or "")  # a name or "*" may be reached from elsewhere


class ZapHandler:
    """The process's ZAP handler (one per zmq context): accepts CURVE clients holding the derived
    client key of one of the tokens it was given."""

    _lock = threading.Lock()
    _instance: "ZapHandler | None" = None

    def __init__(self, ctx: zmq.Context) -> None:
        self._allowed: set[bytes] = set()  # binary (32-byte) client public keys
        self.refused = 0
        self.accepted = 0
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._thread = threading.Thread(target=self._serve, name="dualpath-zap", daemon=True)
        self._thread.start()

    @classmethod
    def for_context(cls, ctx: zmq.Context) -> "ZapHandler":
        with cls._lock:
            if cls._instance is None:
                cls._instance = cls(ctx)
            return cls._instance

    def allow(self, keys: CurveKeys) -> None:
        self._allowed.add(z85.decode(keys.client_public))

    def _serve(self) -> None:
        while True:
            try:
                if not self._sock.poll(ZAP_POLL_MS):
                    continue
                frames = self._sock.recv_multipart()
            except zmq.ZMQError:
                return  # context terminated
            self._sock.send_multipart(self._answer(frames))

    def _answer(self, frames: list[bytes]) -> list[bytes]:
        # request: version, request id, domain, address, identity, mechanism, credentials...
        if len(frames) < 6 or frames[0] != ZAP_VERSION:
            self.refused += 1
            return [ZAP_VERSION, frames[1] if len(frames) > 1 else b"", b"400", b"malformed ZAP request", b"", b""]
        request_id, mechanism, creds = frames[1], frames[5], frames[6:]
        ok = mechanism == b"CURVE" and len(creds) == 1 and any(hmac.compare_digest(creds[0], k) for k in self._allowed)
        if not ok:
            self.refused += 1
            log.warning("refused a %s peer from %s", mechanism.decode(errors="replace"), frames[3].decode(errors="replace"))
            return [ZAP_VERSION, request_id, b"400", b"unknown peer", b"", b""]
        self.accepted += 1
        return [ZAP_VERSION, request_id, b"200", b"OK", b"dualpath", b""]


def secure_server(sock: zmq.Socket, token: bytes) -> None:
    """Make `sock` (before bind) a CURVE server that only the token's holders may connect to."""
    keys = derive_keys(token)
    ZapHandler.for_context(sock.context).allow(keys)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
    sock.setsockopt(zmq.ZAP_DOMAIN, b"dualpath")


def secure_client(sock: zmq.Socket, token: bytes) -> None:
    """Make `sock` (before connect) a CURVE client presenting the token's client key."""
    keys = derive_keys(token)
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)
