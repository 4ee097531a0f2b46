"""Glue between the simulator and the pure policy in `dualpath.core.policy`.

A scheduling pass (one event at PRIO_SCHEDULE, coalesced: at most one pending) runs after any
change that can let work move: an arrival, a PE finishing a prefill (tok_e drops), a DE finishing
a request (HBM frees). In one pass:
  1. every PE group leader fetches, in a rotating order (DualPath: Algorithm 1; otherwise round
     robin under the same beta cap); assigned requests keep global FIFO order;
  2. DE groups fetch (DualPath: the global DE queue drains to the group with the least tokens,
     then each group assigns in-group with HBM fit and Z; otherwise round robin with HBM fit);
  3. each request with both engines gets its read side (DualPath: the shorter node read queue;
     DE path without the scheduler: alternating; no DE path: the PE side) and its read is queued.
Engines pull periodically in the paper; an event-driven pass is the limit of a short period.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TYPE_CHECKING

from ..core.phase import Phase
from ..core.policy import (
    PrefillThresholds,
    RoundRobinCursor,
    choose_read_side,
    distribute_to_groups,
    round_robin_decode,
    round_robin_prefill,
    round_robin_read_side,
    select_decode,
    select_prefill,
)
from ..core.snapshot import GroupLoad, ReadSide
from .events import PRIO_SCHEDULE
from .state import Engine, Node, SimRequest

if TYPE_CHECKING:
    from .simulator import Simulator


class PolicyDriver:
    def __init__(self, sim: "Simulator", thresholds: PrefillThresholds) -> None:
        self.sim = sim
        self.thresholds = thresholds
        self.pe_queue: deque[SimRequest] = deque()
        self.de_queue: deque[SimRequest] = deque()
        self.private: dict[int, deque[SimRequest]] = {n.nid: deque() for n in sim.decode_nodes}
        self.dirty: set[int] = set()  # DE groups whose queue or HBM changed since their last fetch
        self.by_rid: dict = {}
        self._pending = False
        self._pe_turn = 0
        self._de_turn = 0
        self._rr_pe = RoundRobinCursor()
        self._rr_de = RoundRobinCursor()
        self._rr_side = RoundRobinCursor()
        self.num_passes = 0
        self.num_decisions = 0
        self.policy_cpu_s = 0.0  # wall time inside scheduling passes (instrumentation, not sim time)

    def submit(self, req: SimRequest) -> None:
        self.pe_queue.append(req)
        self.kick()

    def kick(self) -> None:
        if not self._pending:
            self._pending = True
            self.sim.loop.call_at(self.sim.loop.now_s, self._pass, None, PRIO_SCHEDULE)

    def _pass(self, _: object) -> None:
        self._pending = False
        self.num_passes += 1
        t0 = time.perf_counter()
        if self.pe_queue:
            self._fetch_prefill()
        if self.de_queue or self.dirty:
            self._fetch_decode()
        self.policy_cpu_s += time.perf_counter() - t0

    # --- 1. PE selection --------------------------------------------------------------------
    def _fetch_prefill(self) -> None:
        sim = self.sim
        groups = sim.prefill_nodes
        n = len(groups)
        start = self._pe_turn
        self._pe_turn = (self._pe_turn + 1) % n
        read_q = {node.nid: node.read_queue_tokens for node in sim.nodes}
        engines_by_id = sim.engines_by_id
        for k in range(n):
            if not self.pe_queue:
                break
            node = groups[(start + k) % n]
            # equivalent shortcut: every engine over beta means the fetch assigns nothing
            if all(e.num_tokens > self.thresholds.beta_tokens for e in node.engines):
                continue
            loads = [e.load() for e in node.engines]
            views = (r.qview for r in self.pe_queue)
            if sim.features.dualpath_scheduler:
                out = select_prefill(loads, read_q, views, self.thresholds)
            else:
                out, self._rr_pe = round_robin_prefill(loads, views, self.thresholds.beta_tokens, self._rr_pe)
            for a in out:
                req = self.pe_queue.popleft()
                assert req.rid == a.rid, "PE assignment must follow FIFO order"
                eng = engines_by_id[a.engine]
                req.pe = eng
                eng.num_seqs += 1
                eng.num_tokens += req.input_tokens
                req.t_pe = sim.loop.now_s
                req.to(Phase.PE_ASSIGNED)
                self.de_queue.append(req)
                self.num_decisions += 1

    # --- 2. DE selection --------------------------------------------------------------------
    def _fetch_decode(self) -> None:
        sim = self.sim
        if sim.features.dualpath_scheduler:
            self._fetch_decode_dualpath()
        else:
            self._fetch_decode_round_robin()

    def _fetch_decode_dualpath(self) -> None:
        sim = self.sim
        groups = sim.decode_nodes
        if self.de_queue:
            totals = {node.nid: sum(e.num_tokens for e in node.engines) for node in groups}
            placed = distribute_to_groups(totals, (r.qview for r in self.de_queue))
            for ga in placed:
                req = self.de_queue.popleft()
                assert req.rid == ga.rid
                self.private[ga.group].append(req)
                self.dirty.add(ga.group)
        n = len(groups)
        start = self._de_turn
        self._de_turn = (self._de_turn + 1) % n
        for k in range(n):
            node = groups[(start + k) % n]
            q = self.private[node.nid]
            if node.nid not in self.dirty:
                continue
            self.dirty.discard(node.nid)
            # equivalent shortcut: phase 2 assigns nothing if no DE fits the head request
            if not q or max(e.hbm_free_bytes for e in node.engines) < q[0].hbm_bytes:
                continue
            snap = GroupLoad(node.nid, tuple(e.load() for e in node.engines))
            out = select_decode(snap, _fitting_prefix(q, snap), sim.cfg.scheduler.z_factor)
            for a in out:
                req = q.popleft()
                assert req.rid == a.rid
                self._assign_de(req, sim.engines_by_id[a.engine])

    def _fetch_decode_round_robin(self) -> None:
        sim = self.sim
        self.dirty.clear()
        if not self.de_queue:
            return
        loads = [e.load() for node in sim.decode_nodes for e in node.engines]
        out, self._rr_de = round_robin_decode(loads, (r.qview for r in self.de_queue), self._rr_de)
        for a in out:
            req = self.de_queue.popleft()
            assert req.rid == a.rid
            self._assign_de(req, sim.engines_by_id[a.engine])

    def _assign_de(self, req: SimRequest, eng: Engine) -> None:
        sim = self.sim
        req.de = eng
        eng.num_seqs += 1
        eng.num_tokens += req.de_len_tokens
        eng.hbm_free_bytes -= req.hbm_bytes
        req.t_de = sim.loop.now_s
        self.num_decisions += 1
        self._choose_side_and_read(req)

    # --- 3. read side -----------------------------------------------------------------------
    def _choose_side_and_read(self, req: SimRequest) -> None:
        sim = self.sim
        sim.resolve_hit(req)
        pe_node: Node = req.pe.node
        de_node: Node = req.de.node
        f = sim.features
        if not f.de_read_path:
            side = ReadSide.PREFILL
        elif f.dualpath_scheduler:
            side = choose_read_side(pe_node.read_queue_tokens, de_node.read_queue_tokens)
        else:
            side, self._rr_side = round_robin_read_side(self._rr_side)
        req.side = side
        if req.hit_tokens == 0 or f.io_free:
            sim.prefill_ready(req)
        else:
            sim.reads.enqueue(req, pe_node if side is ReadSide.PREFILL else de_node)


def _fitting_prefix(q: deque, group: GroupLoad) -> list:
    """The head of a private queue that phase 2 can touch: the requests whose running HBM sum
    fits the group's total free HBM (step 1's R), plus the first that does not. Nothing past it
    can be assigned in this fetch, and R over this prefix equals R over the whole queue, so
    passing only this prefix is exact and keeps a pass O(assignable) instead of O(queue)."""
    free = sum(e.free_hbm_bytes for e in group.engines)
    out = []
    for r in q:
        out.append(r.qview)
        free -= r.hbm_bytes
        if free < 0:
            break
    return out
