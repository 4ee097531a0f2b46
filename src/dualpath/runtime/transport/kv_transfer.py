"""Moving a Layer or Full Block between engine processes on one host (DESIGN.md 4 step 5).

The holder writes into the receiver's host buffer (the RDMA WRITE of PAPER.md 2.2) through its
link's arbiter, on a lane, then tells the receiver.

Lifecycle of one block:
1. The receiver allocates a slot in its `HostBuffer` and sends the holder
   `KvPull(request_id, layer, segment, offset_bytes, nbytes, reply_to=receiver.endpoint)`.
2. The holder calls `ShmKvSender.send(request_id, layer, src, dst, reply_to, lane)`: the source
   region of its own buffer and the destination from the pull (attached on first use).
3. The holder's `LinkArbiter` copies the bytes chunk by chunk (`ContiguousCopy`: memmove, GIL
   released), lanes arbitrated and the link's rate applied.
4. At delivery, on the link's thread, the sender pushes `KvReady` to `reply_to`.
5. The receiver's `ShmKvReceiver.recv()` returns the `KvReady`; `view(ready)` reads the bytes;
   the receiver frees the slot when it has consumed them.
6. Teardown: close the holder's arbiter (no more completions), then `ShmKvSender.close()` (detach,
   flush notifications), then the receiver, then the host buffers (owners unlink).
"""

from __future__ import annotations

import threading

import numpy as np

from ...core.lanes import Lane
from .arbiter import LinkArbiter, TransferHandle, TransferResult
from .channel import Inbox, Outbox
from .messages import KvReady
from .shm import HostBuffer, SharedSegments, ShmRegion
from .transfer import ContiguousCopy


class ShmKvSender:
    """The holder's side: owns no buffer, writes through `segments` on `arbiter`'s link."""

    def __init__(self, arbiter: LinkArbiter, segments: SharedSegments) -> None:
        self._arbiter = arbiter
        self._segments = segments
        self._outboxes: dict[str, Outbox] = {}
        self._lock = threading.Lock()

    def send(self, request_id: int, layer: int | None, src: ShmRegion, dst: ShmRegion, reply_to: str,
             lane: Lane = Lane.KV) -> TransferHandle:
        """Copy `src` into `dst` (same size) over the link, then send `KvReady` to `reply_to`."""
        if src.nbytes != dst.nbytes:
            raise ValueError(f"source has {src.nbytes} bytes, destination {dst.nbytes}")
        do_chunk = ContiguousCopy(self._segments.view(dst), self._segments.view(src))
        outbox = self._outbox(reply_to)
        ready = KvReady(request_id, layer, dst.segment, dst.offset_bytes, dst.nbytes)

        def on_done(result: TransferResult) -> None:
            outbox.send(ready)

        return self._arbiter.submit(lane, src.nbytes, do_chunk, on_done)

    def close(self) -> None:
        """Flush and close the notification sockets (close the arbiter first)."""
        with self._lock:
            outboxes, self._outboxes = self._outboxes, {}
        for o in outboxes.values():
            o.close()

    def _outbox(self, endpoint: str) -> Outbox:
        with self._lock:
            o = self._outboxes.get(endpoint)
            if o is None:
                o = self._outboxes[endpoint] = Outbox(endpoint)
            return o


class ShmKvReceiver:
    """The receiver's side: its host buffer and the inbox `KvReady` arrives at."""

    def __init__(self, buffer: HostBuffer, endpoint: str) -> None:
        self.buffer = buffer
        self.endpoint = endpoint
        self._inbox = Inbox(endpoint)

    def recv(self, timeout_s: float | None = None) -> KvReady | None:
        """The next `KvReady`, or None after `timeout_s`; other messages raise `TypeError`."""
        msg = self._inbox.recv(timeout_s)
        if msg is not None and not isinstance(msg, KvReady):
            raise TypeError(f"expected KvReady on {self.endpoint}, got {type(msg).__name__}")
        return msg

    def view(self, ready: KvReady) -> np.ndarray:
        return self.buffer.view(ShmRegion(ready.segment, ready.offset_bytes, ready.nbytes))

    def close(self) -> None:
        self._inbox.close()
