"""Shared pieces of the remote-write tests: a target with an inbox, and a raw peer that speaks
the handshake by hand (to send frames no WriteInitiator would)."""

import queue
import socket
import struct
import threading

import numpy as np

from dualpath.core.lanes import Lane
from dualpath.runtime.transport.remote_write import wire
from dualpath.runtime.transport.remote_write.target import WriteTarget

WAIT_S = 10.0  # generous on a loaded 2-core CI machine; a passing test waits milliseconds


class Inbox:
    """on_immediate for a target: (lane, message) pairs in arrival order, with a check run at
    delivery time (what the receiver sees the moment the IMM arrives)."""

    def __init__(self, check=None):
        self.items: queue.Queue = queue.Queue()
        self.check = check

    def __call__(self, lane, message):
        seen = self.check(lane, message) if self.check is not None else None
        self.items.put((lane, message, seen))

    def get(self, timeout_s=WAIT_S):
        return self.items.get(timeout=timeout_s)


def sentinel(nbytes, value=0xA5):
    return np.full(nbytes, value, dtype=np.uint8)


def raw_peer(target: WriteTarget, lane=Lane.KV, token: bytes | None = None) -> socket.socket:
    """A socket past the handshake, as a WriteInitiator's would be, for sending raw frames."""
    s = socket.create_connection(target.address, timeout=WAIT_S)
    challenge = _recv(s, wire.CHALLENGE.size)
    _, _, nonce = wire.CHALLENGE.unpack(challenge)
    mac = wire.hello_mac(token, nonce, lane) if token else bytes(wire.MAC_BYTES)
    s.sendall(wire.HELLO.pack(wire.MAGIC, wire.PROTOCOL_VERSION, int(lane), int(token is not None), mac, -1, 0))
    assert _recv(s, 1) == wire.ACCEPT
    return s


def raw_header(kind, name_len, nbytes, offset, reserved=0):
    return struct.pack("<BBHIQ", kind, name_len, reserved, nbytes, offset)


def closed_by_peer(s: socket.socket, timeout_s=WAIT_S) -> bool:
    """Whether the target hung up on `s` (EOF or reset) within the timeout."""
    s.settimeout(timeout_s)
    try:
        while True:
            if not s.recv(4096):
                return True
    except ConnectionResetError:
        return True
    except (socket.timeout, TimeoutError):
        return False


def wait_until(predicate, timeout_s=WAIT_S):
    done = threading.Event()
    for _ in range(int(timeout_s / 0.005)):
        if predicate():
            return True
        done.wait(0.005)
    return predicate()


def _recv(s, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed during the handshake")
        buf += chunk
    return bytes(buf)
