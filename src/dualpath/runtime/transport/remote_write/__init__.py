"""Remote writes: RDMA WRITE-with-immediate emulated over TCP, the KV path between hosts.

On one host every KV byte between engines is a memcpy into a peer's shared-memory mapping
(shm.SharedSegments, the stand-in for RDMA memory registration). Between hosts it cannot be:
the receiver registers its regions with a `WriteTarget`, the sender opens a `WriteInitiator`
(one DSCP-marked TCP connection per lane) and writes into them; an immediate message on the same
lane is delivered only after every earlier write has landed, as RDMA's WRITE_WITH_IMM
completion is. `RemoteSpanWrite` is the `do_chunk` a `LinkArbiter` drives, SpanCopy's
counterpart. Engines use it across hosts: engine/peers.py (transport.kind tcp).

- `wire`: handshake (challenge, HMAC hello), frame headers, limits.
- `target`: `WriteTarget`, registered regions, bounds-checked recv_into, per-lane counters.
- `initiator`: `WriteInitiator`, zero-copy sendmsg of buffer views, per-lane locks.
- `span_write`: `RemoteSpanWrite`, `submit_with_immediate`.
"""

from .initiator import InitiatorStats, WriteInitiator
from .span_write import RemoteSpanWrite, submit_with_immediate
from .target import ConnectionMarks, TargetStats, WriteTarget
from .wire import PeerRefused, RemoteWriteError

__all__ = [
    "ConnectionMarks", "InitiatorStats", "PeerRefused", "RemoteSpanWrite", "RemoteWriteError", "TargetStats",
    "WriteInitiator", "WriteTarget", "submit_with_immediate",
]
