"""The simulator's side of the scheduling pass: when it runs, what it sees, how it is applied.

`core.scheduler.GlobalScheduler` decides; this module only
  1. runs a pass (one event at PRIO_SCHEDULE, coalesced: at most one pending) after any change
     that can let work move: an arrival, a PE finishing a prefill (tok_e drops), a DE finishing a
     request (HBM frees);
  2. answers the pass's questions from the modelled cluster (`SimView`);
  3. applies the pass in its order: a PE assignment takes len(r) on the engine; a DE assignment
     takes the final length and HBM and hands the request to placement (persists.py:
     `PlacementGate`), which queues the read of the hit (resolved during the pass) on the chosen
     side (or, with nothing to read or a free network, makes the request prefill-ready at once).
     A split read (`dualpath+split`) carries its PE-side part; reads.py reads both parts. A
     request prefilled on its DE (`+selective`) has no PE assignment: its read is on its DE's node,
     or on a relay PE node (`relay_node`), and its DE prefills it (simulator.py `_prefill_on_de`).
"""

from __future__ import annotations

import time
from typing import Sequence

from ..core.phase import Phase
from ..core.policy import PrefillThresholds, RecomputeRule, SplitRule
from ..core.scheduler import ClusterView, GlobalScheduler, SchedulePass, SchedulerRules
from ..core.snapshot import EngineLoad, ReadSide
from ..metrics.decisions import DecisionLog
from .events import PRIO_SCHEDULE
from .kv_io import KvIo
from .lifecycle import SimContext, TurnLifecycle
from .persists import PlacementGate
from .reads import StorageReads
from .state import Engine, Node, SimRequest


class SimView(ClusterView):
    """The cluster as the scheduler sees it: engine snapshots, node read queues, hits."""

    def __init__(self, nodes: Sequence[Node], life: TurnLifecycle, io: KvIo, latency_s: float = 0.0) -> None:
        assert all(n.nid == i for i, n in enumerate(nodes))
        self._latency_s = latency_s  # the configured store latency (ClusterConfig), every node
        self._nodes = list(nodes)  # by node id
        self._life = life
        self._io = io

    def pe_loads(self, group: int) -> list[EngineLoad]:
        return self._nodes[group].loads()

    def de_loads(self, group: int) -> list[EngineLoad]:
        return self._nodes[group].loads()

    def read_queue_tokens(self, node: int) -> int:
        return self._nodes[node].read_queue_tokens

    def read_tokens(self, req: SimRequest) -> int:
        """The hit is resolved here, when the DE is chosen (`Simulator.resolve_hit`); nothing is read
        when it is empty or the network is free (kv_io.py)."""
        self._life.resolve_hit(req)
        return self._io.tokens_to_read(req)

    def dram_tokens(self, req: SimRequest, node: int, hit_tokens: int) -> int:
        return self._nodes[node].dram.held_tokens(req.rid.agent, 0, hit_tokens, False)

    def store_latency_s(self, node: int) -> float:
        return self._latency_s


class Dispatch:
    def __init__(self, ctx: SimContext, life: TurnLifecycle, reads: StorageReads, nodes: Sequence[Node],
                 engines: dict[int, Engine], thresholds: PrefillThresholds, gate: PlacementGate,
                 recompute: RecomputeRule | None = None) -> None:
        self.ctx = ctx
        self.life = life
        self.reads = reads
        self.gate = gate
        self.engines = engines
        self.nodes = list(nodes)  # by node id
        f = ctx.features
        rules = SchedulerRules(thresholds, f.dualpath_scheduler, f.de_read_path, ctx.cfg.scheduler.z_factor,
                               recompute=recompute, split=_split_rule(ctx) if f.split_reads else None,
                               tail_share=f.tail_share,
                               local_max_tokens=ctx.cfg.scheduler.local_prefill_max_tokens if f.local_prefill else None,
                               dram_tier=f.dram_tier)
        pe_groups = [n.nid for n in nodes if n.is_prefill]
        de_groups = [n.nid for n in nodes if not n.is_prefill]
        self.scheduler = GlobalScheduler(pe_groups, de_groups, rules)
        self.view = SimView(nodes, life, ctx.io, ctx.cfg.cluster.storage_read_latency_s)
        self._pending = False
        # every decision as metrics/decisions.py writes it; None (the default): not recorded
        self.decisions: DecisionLog | None = None
        self._first_de_engine = min(e.eid for n in nodes if not n.is_prefill for e in n.engines)
        self.policy_cpu_s = 0.0  # wall time inside scheduling passes (instrumentation, not sim time)

    def submit(self, req: SimRequest) -> None:
        self.scheduler.submit(req.qview, req)
        self.kick()

    def pe_released(self, node: Node) -> None:
        engines = node.engines
        least = engines[0].num_tokens
        for e in engines:
            if e.num_tokens < least:
                least = e.num_tokens
        self.scheduler.pe_released(node.nid, least)

    def de_released(self, node: Node) -> None:
        total = 0
        for e in node.engines:
            total += e.num_tokens
        self.scheduler.de_released(node.nid, total)
        self.kick()

    def kick(self) -> None:
        if not self._pending:
            self._pending = True
            loop = self.ctx.loop
            loop.call_at(loop.now_s, self._pass, None, PRIO_SCHEDULE)

    def check_invariants(self) -> None:
        self.scheduler.check_invariants(self.view)

    def _pass(self, _: object) -> None:
        self._pending = False
        t0 = time.perf_counter()
        self._apply(self.scheduler.schedule(self.view))
        self.policy_cpu_s += time.perf_counter() - t0

    def _apply(self, p: SchedulePass) -> None:
        now = self.ctx.loop.now_s
        engines = self.engines
        for a in p.prefill:
            req: SimRequest = a.ref
            eng = engines[a.engine]
            req.pe = eng
            eng.take(req.input_tokens)
            req.t_pe = now
            req.to(Phase.PE_ASSIGNED)
        for d in p.decode:
            req = d.ref  # its hit was resolved during the pass (SimView.read_tokens)
            eng = engines[d.engine]
            if d.local:  # no PE: its DE prefills it
                req.local = True
                req.t_pe = now
                if d.relay_node >= 0:
                    req.relay = self.nodes[d.relay_node]
            req.de = eng
            eng.take(req.de_len_tokens, req.hbm_bytes)
            req.t_de = now
            req.side = d.side
            req.pe_part_tokens = d.pe_part_tokens
            if self.decisions is not None:
                self.decisions.record(str(req.rid), now, -1 if req.pe is None else req.pe.eid, eng.eid - self._first_de_engine, int(d.side),
                                      d.read_tokens, d.pe_part_tokens, d.pe_cost_tokens, d.de_cost_tokens)
            if d.recompute:  # the store is slower than computing the hit again
                self.life.recompute_hit(req)
            self.gate.admit(req, req.pe_side_node if d.side is ReadSide.PREFILL else eng.node, d.recompute)

    @property
    def num_passes(self) -> int:
        return self.scheduler.num_passes

    @property
    def num_decisions(self) -> int:
        return self.scheduler.num_decisions


def _split_rule(ctx: SimContext) -> SplitRule:
    """Split reads (core/policy/split.py) on the paper presets: each node reads at its SNIC's read
    rate (a PE node's scaled by ClusterConfig.prefill_snic_scale), and a DE node streams the DE
    part to the PE over its GPUs' CNICs together."""
    cl = ctx.cfg.cluster
    ns = cl.node
    return SplitRule(cl.block_tokens, ctx.kv_bytes_per_token, ns.snic_read_bytes_per_s * cl.prefill_snic_scale,
                     ns.snic_read_bytes_per_s, ns.gpus_per_node * ns.cnic_bytes_per_s, ctx.cfg.scheduler.split_min_blocks)
