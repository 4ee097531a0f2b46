"""The network and buffers a mode's KV moves through, chosen once per run (`kv_io_for`).

Every mode but the oracle runs on `NetworkKvIo`: the hit is read from storage, a request reserves
DE-buffer room for its prompt KV, the prompt KV crosses the DE's CNIC into HBM (H2D), and each
persist books its bytes on the DE node's SNIC. The oracle (docs/paper.md §6.1: "zero I/O overhead") runs
on `FreeKvIo`: nothing is read, reserved, moved or booked. So the oracle is a free network and
unbounded buffers, not a branch inside each mechanism; the prefill group picks its own pipeline
the same way (prefill.py: `pipeline_for`).
"""

from __future__ import annotations

from typing import Any, Callable

from ..core.lanes import Lane
from .links import Flow, Link, Network
from .state import SimRequest


class KvIo:
    """Network and buffers as modelled (flows on links, DE-buffer reservations)."""

    def __init__(self, net: Network, kv_bytes_per_token: int) -> None:
        self.net = net
        self.kv_bytes_per_token = kv_bytes_per_token

    def tokens_to_read(self, req: SimRequest) -> int:
        """Hit tokens to read from storage once the DE is chosen (0: the request is ready at once)."""
        return req.hit_tokens

    def de_buffer_need_at_prefill(self, req: SimRequest) -> int:
        """DE-buffer bytes a request must reserve before its first forward (PE path and no-hit
        requests; the DE path reserved at its read)."""
        if req.de_buffer_bytes:
            return 0
        return req.input_tokens * self.kv_bytes_per_token

    def to_decode_hbm(self, req: SimRequest, nbytes: int, cnic: tuple[Link, ...], done: Callable[[Flow], None]) -> bool:
        """Start the H2D of the prompt KV (DE buffer -> DE HBM over the DE's CNIC, both
        directions); `done` follows. False: nothing to move, the KV is in HBM now."""
        self.net.start(nbytes, Lane.KV, cnic, done, req)
        return True

    def persists_take_time(self) -> bool:
        """Whether a persist's write may take time (persists.py); the oracle's are free."""
        return True

    def reserves_buffers(self) -> bool:
        """Whether requests take host-buffer room (reads.py, prefill.py, persists.py); the oracle's are unbounded."""
        return True

    def persist(self, snic_out: Link, nbytes: float, d2h: Link | None = None,
                done: Callable[[Flow], None] | None = None, tag: Any = None) -> float:
        """Book a persist's bytes on the SNIC's write side; the bytes booked. `d2h`: the link the
        blocks' copy out of HBM crosses first (the runtime's DE arbiter, `cnic_as_runtime_arbiter`),
        a flow that holds that link's KV queue as long as it takes; `done(flow)` (with `tag`)
        follows it. The write's own time is persists.py's."""
        self.net.book(snic_out, Lane.KV, nbytes)
        if d2h is not None:
            self.net.start(nbytes, Lane.KV, (d2h,), _ignore if done is None else done, tag)
        return nbytes


class FreeKvIo(KvIo):
    """The oracle's: a free network and unbounded buffers."""

    def tokens_to_read(self, req: SimRequest) -> int:
        return 0

    def de_buffer_need_at_prefill(self, req: SimRequest) -> int:
        return 0

    def to_decode_hbm(self, req: SimRequest, nbytes: int, cnic: tuple[Link, ...], done: Callable[[Flow], None]) -> bool:
        return False

    def persists_take_time(self) -> bool:
        return False

    def reserves_buffers(self) -> bool:
        return False

    def persist(self, snic_out: Link, nbytes: float, d2h: Link | None = None,
                done: Callable[[Flow], None] | None = None, tag: Any = None) -> float:
        return 0.0


def _ignore(_flow: Flow) -> None:
    pass


def kv_io_for(io_free: bool, net: Network, kv_bytes_per_token: int) -> KvIo:
    return FreeKvIo(net, kv_bytes_per_token) if io_free else KvIo(net, kv_bytes_per_token)
