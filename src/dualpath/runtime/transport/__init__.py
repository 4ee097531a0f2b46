"""Transport and traffic manager of the runtime (docs/paper.md §2; module map in docs/structure.md).

- `token_bucket`: NIC rate emulation (SNIC, CNIC) with debt semantics; None = unlimited.
- `drr`: byte-weighted deficit round robin over the two lanes (pure policy).
- `arbiter`: `LinkArbiter`, one thread per emulated link; every byte crossing a CNIC goes through it.
- `transfer`: `TransferHandle` / `TransferResult` of one transfer, `LinkStats` of a link, and the
  two `do_chunk`s every KV byte moves with: `ContiguousCopy` (two contiguous arrays, one memmove)
  and `SpanCopy` (span lists: host buffers, KV caches, host <-> GPU).
- `shm`: a node's host buffer as a shared-memory segment of fixed-size slots; `ShmRegion` addresses.
- `messages`, `channel`: msgpack control messages over ZeroMQ PUSH/PULL (ipc:// on one host).
- `tcp`: lanes as DSCP / SO_PRIORITY on TCP sockets between hosts.
"""

from .arbiter import LinkArbiter
from .shm import BufferFull, HostBuffer, SharedSegments, ShmRegion
from .token_bucket import TokenBucket
from .transfer import ArbiterClosed, ContiguousCopy, LinkStats, SpanCopy, TransferFailed, TransferHandle, TransferResult

__all__ = [
    "ArbiterClosed", "BufferFull", "ContiguousCopy", "HostBuffer", "LinkArbiter", "LinkStats", "SharedSegments", "ShmRegion",
    "SpanCopy", "TokenBucket", "TransferFailed", "TransferHandle", "TransferResult",
]
