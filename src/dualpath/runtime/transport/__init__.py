"""Transport and traffic manager of the runtime (DESIGN.md 5, PAPER.md 2).

- `token_bucket`: NIC rate emulation (SNIC, CNIC) with debt semantics; None = unlimited.
- `drr`: byte-weighted deficit round robin over the two lanes (pure policy).
- `arbiter`: `LinkArbiter`, one thread per emulated link; every byte crossing a CNIC goes through it.
- `transfer`: `TransferHandle` / `TransferResult` of one transfer, `LinkStats` of a link,
  `ContiguousCopy` (a cheap `do_chunk`).
- `shm`: a node's host buffer as a shared-memory segment of fixed-size slots; `ShmRegion` addresses.
- `messages`, `channel`: msgpack control messages over ZeroMQ PUSH/PULL (ipc:// on one host).
- `kv_transfer`: `ShmKvSender` / `ShmKvReceiver`, a Layer or Full Block between processes.
- `tcp`: lanes as DSCP / SO_PRIORITY on TCP sockets between hosts.
- `bench`: `run_lanes_bench`, `run_transport_bench`.
"""

from .arbiter import LinkArbiter
from .shm import BufferFull, HostBuffer, SharedSegments, ShmRegion
from .token_bucket import TokenBucket
from .transfer import ArbiterClosed, ContiguousCopy, LinkStats, TransferFailed, TransferHandle, TransferResult

__all__ = [
    "ArbiterClosed", "BufferFull", "ContiguousCopy", "HostBuffer", "LinkArbiter", "LinkStats", "SharedSegments", "ShmRegion",
    "TokenBucket", "TransferFailed", "TransferHandle", "TransferResult",
]
