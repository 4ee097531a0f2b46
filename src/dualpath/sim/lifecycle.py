"""What the simulator's components share, and the turn's hooks they call: no component holds or
imports the `Simulator`, so no import cycle runs back to it (tests/core/test_imports.py).

`SimContext` is frozen and built once: the event loop, the network, the compute model, the mode's
features and KV I/O model (kv_io.py), the config and the sizes every component reads. `TurnLifecycle` is the numbered path of a
turn as the components report it (a mypyc trait, so compiled calls stay native); `Simulator`
implements it (simulator.py holds the bodies and the numbers):

  2. `resolve_hit`       the DE is chosen: the hit is fixed (dispatch.py)
  3. `prefill_ready`     the hit KV is in a host buffer, or there is nothing to read (reads.py)
  4. `kick_prefill`      a PE group may start a forward (a request became ready, a buffer freed)
     `release_buffer`   a PE- or DE-buffer reservation ends (prefill.py)
     `prefill_computed`  the last chunk computed: first token (prefill.py)
  5. `kv_landed`         the prompt KV is whole in the DE buffer (prefill.py)
  6. `decode_finished`   the last token (decode.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from mypy_extensions import trait

from ..config import Features, SimConfig
from ..metrics.timeline import Timeline
from .cpu_share import CpuShare
from .compute import StepTimes
from .events import EventLoop
from .kv_io import KvIo
from .links import Link, Network
from .state import Node, SimRequest


@dataclass(frozen=True, slots=True)
class SimContext:
    loop: EventLoop  # the one clock and event queue
    net: Network  # every flow and booked byte
    compute: StepTimes  # seconds of forwards and decode steps (compute.py or compute_measured.py)
    features: Features  # the mode
    cfg: SimConfig
    kv_bytes_per_token: int  # of the model, all layers
    pe_kv_hbm_bytes: float  # a PE GPU's HBM for KV (the non-layerwise batch limit)
    storage_egress: Optional[Link]  # the storage cluster's egress link, None = unlimited
    io: KvIo  # the network and buffers the mode's KV moves through (kv_io.py; the oracle's are free)
    timeline: Timeline  # spans of the run (metrics/timeline.py); NULL_TIMELINE when not recorded
    cpu: CpuShare  # compute and I/O on shared cores (cpu_share.py); NO_CPU_SHARE but for a measured `local` preset


@trait
class TurnLifecycle:
    def resolve_hit(self, req: SimRequest) -> None:
        raise NotImplementedError

    def prefill_ready(self, req: SimRequest) -> None:
        raise NotImplementedError

    def recompute_hit(self, req: SimRequest) -> None:
        raise NotImplementedError

    def kick_prefill(self, node_id: int) -> None:
        raise NotImplementedError

    def release_buffer(self, node: Node, nbytes: float) -> None:
        raise NotImplementedError

    def prefill_computed(self, req: SimRequest) -> None:
        raise NotImplementedError

    def kv_landed(self, req: SimRequest) -> None:
        raise NotImplementedError

    def decode_finished(self, req: SimRequest) -> None:
        raise NotImplementedError

    def block_filled(self, req: SimRequest, index: int) -> None:
        """The decode step that gave block `index` of `req`'s sequence KV at every position ended
        (`+dram` with timed persists: decode.py, persists.py)."""
        raise NotImplementedError

    def local_prefill_done(self, req: SimRequest) -> None:
        raise NotImplementedError
