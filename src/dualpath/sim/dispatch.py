"""The simulator's side of the scheduling pass: when it runs, what it sees, how it is applied.

`core.scheduler.GlobalScheduler` decides; this module only
  1. runs a pass (one event at PRIO_SCHEDULE, coalesced: at most one pending) after any change
     that can let work move: an arrival, a PE finishing a prefill (tok_e drops), a DE finishing a
     request (HBM frees);
  2. answers the pass's questions from the modelled cluster (`SimView`);
  3. applies the pass in its order: a PE assignment takes len(r) on the engine; a DE assignment
     takes the final length and HBM, resolves the hit and queues the read on the chosen side
     (or, with nothing to read or a free network, makes the request prefill-ready at once).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

from ..core.phase import Phase
from ..core.policy import PrefillThresholds
from ..core.request import RequestId, usable_hit_tokens
from ..core.scheduler import GlobalScheduler, SchedulePass, SchedulerRules
from ..core.snapshot import EngineLoad, ReadSide
from .events import PRIO_SCHEDULE
from .state import Node, SimRequest

if TYPE_CHECKING:
    from .simulator import Simulator


class SimView:
    """The cluster as the scheduler sees it: engine snapshots, node read queues, hits."""

    def __init__(self, nodes: Sequence[Node], inflight: dict, block_tokens: int, io_free: bool) -> None:
        self._nodes = {n.nid: n for n in nodes}
        self._inflight = inflight
        self._block_tokens = block_tokens
        self._io_free = io_free

    def pe_loads(self, group: int) -> list[EngineLoad]:
        return [e.load() for e in self._nodes[group].engines]

    def de_loads(self, group: int) -> list[EngineLoad]:
        return [e.load() for e in self._nodes[group].engines]

    def read_queue_tokens(self, node: int) -> int:
        return self._nodes[node].read_queue_tokens

    def read_tokens(self, rid: RequestId) -> int:
        if self._io_free:
            return 0
        req: SimRequest = self._inflight[rid]
        return usable_hit_tokens(req.agent.context_tokens, req.input_tokens, self._block_tokens)


class Dispatch:
    def __init__(self, sim: "Simulator", thresholds: PrefillThresholds) -> None:
        self.sim = sim
        f = sim.features
        rules = SchedulerRules(thresholds, f.dualpath_scheduler, f.de_read_path, sim.cfg.scheduler.z_factor)
        self.scheduler = GlobalScheduler([n.nid for n in sim.prefill_nodes], [n.nid for n in sim.decode_nodes], rules)
        self.view = SimView(sim.nodes, sim.inflight, sim.block_tokens, f.io_free)
        self._pending = False
        self.policy_cpu_s = 0.0  # wall time inside scheduling passes (instrumentation, not sim time)

    def submit(self, req: SimRequest) -> None:
        self.scheduler.submit(req.qview)
        self.kick()

    def pe_released(self, node: Node) -> None:
        self.scheduler.pe_released(node.nid, self.view)

    def de_released(self, node: Node) -> None:
        self.scheduler.de_released(node.nid, self.view)
        self.kick()

    def kick(self) -> None:
        if not self._pending:
            self._pending = True
            self.sim.loop.call_at(self.sim.loop.now_s, self._pass, None, PRIO_SCHEDULE)

    def check_invariants(self) -> None:
        self.scheduler.check_invariants(self.view)

    def _pass(self, _: object) -> None:
        self._pending = False
        t0 = time.perf_counter()
        self._apply(self.scheduler.schedule(self.view))
        self.policy_cpu_s += time.perf_counter() - t0

    def _apply(self, p: SchedulePass) -> None:
        sim = self.sim
        now = sim.loop.now_s
        engines = sim.engines_by_id
        inflight = sim.inflight
        for a in p.prefill:
            req: SimRequest = inflight[a.rid]
            eng = engines[a.engine]
            req.pe = eng
            eng.take(req.input_tokens)
            req.t_pe = now
            req.to(Phase.PE_ASSIGNED)
        for d in p.decode:
            req = inflight[d.rid]
            eng = engines[d.engine]
            req.de = eng
            eng.take(req.de_len_tokens, req.hbm_bytes)
            req.t_de = now
            sim.resolve_hit(req)
            req.side = d.side
            if d.read_tokens == 0:  # nothing to read, or a free network
                sim.prefill_ready(req)
            else:
                assert req.pe is not None
                sim.reads.enqueue(req, req.pe.node if d.side is ReadSide.PREFILL else eng.node)

    @property
    def num_passes(self) -> int:
        return self.scheduler.num_passes

    @property
    def num_decisions(self) -> int:
        return self.scheduler.num_decisions
