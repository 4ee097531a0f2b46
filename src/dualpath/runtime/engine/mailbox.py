"""An engine's mail: its inbox, one outbox per process it writes to, and the messages that came
before the assignment they belong to.

Everything that completes off the engine's main thread (a storage read, a copy on the CNIC's
arbiter) posts a message to the engine's own inbox (`to_self`), so the loop waits in one place:
`recv`. The router's assignment and a peer's message about the same request travel on different
sockets, so a peer's message can arrive first: `hold` keeps it until the assignment is here
(`take_held`), and drops it if the request has already ended (`ended`).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from ..transport.channel import Inbox, Outbox

ENDED_REMEMBERED = 65536  # requests whose late messages are dropped, not held (the newest ones)


class Mailbox:
    def __init__(self, endpoint: str, router_endpoint: str, token: bytes | None) -> None:
        self._token, self._router = token, router_endpoint
        self.inbox = Inbox(endpoint, token=token)
        self.endpoint = self.inbox.endpoint  # tcp://HOST:0: the port it bound
        self._outboxes: dict[str, Outbox] = {}
        self._lock = threading.Lock()  # the reader, writer, heartbeat and arbiter threads send too
        self._held: dict[int, list] = {}
        self._ended: set[int] = set()
        self._ended_order: collections.deque[int] = collections.deque()

    def recv(self, timeout_s: float) -> Any:
        return self.inbox.recv(timeout_s)

    def send(self, endpoint: str, msg: Any) -> None:
        with self._lock:
            box = self._outboxes.get(endpoint)
            if box is None:
                box = self._outboxes[endpoint] = Outbox(endpoint, token=self._token)
        box.send(msg)

    def to_router(self, msg: Any) -> None:
        self.send(self._router, msg)

    def to_self(self, msg: Any) -> None:
        self.send(self.endpoint, msg)

    def close_router_box(self) -> None:
        """Flush what was sent to the router (the outbox's linger) before the process ends."""
        with self._lock:
            box = self._outboxes.pop(self._router, None)
        if box is not None:
            box.close()

    def control_bytes_sent(self) -> int:
        """The encoded bytes of the messages sent to other processes (the router, peers), to itself not."""
        with self._lock:
            return sum(box.sent_bytes for endpoint, box in self._outboxes.items() if endpoint != self.endpoint)

    # --- messages that overtake the assignment they depend on --------------------------------
    def hold(self, rid: int, msg: Any) -> None:
        if rid not in self._ended:
            self._held.setdefault(rid, []).append(msg)

    def take_held(self, rid: int) -> list:
        return self._held.pop(rid, [])

    def has_ended(self, rid: int) -> bool:
        return rid in self._ended

    def ended(self, rid: int) -> None:
        self._held.pop(rid, None)
        self._ended.add(rid)
        self._ended_order.append(rid)
        if len(self._ended_order) > ENDED_REMEMBERED:
            self._ended.discard(self._ended_order.popleft())

    def close(self) -> None:
        with self._lock:
            for box in self._outboxes.values():
                box.close()
        self.inbox.close()
