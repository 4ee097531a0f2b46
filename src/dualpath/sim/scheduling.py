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
        self._de_pos = {n.nid: i for i, n in enumerate(sim.decode_nodes)}  # a DE group's place in the fetch rotation
        self._pe_pos = {n.nid: i for i, n in enumerate(sim.prefill_nodes)}
        self._de_totals = {n.nid: 0 for n in sim.decode_nodes}  # phase 1's sum of tok_e per DE group, kept current
        self._pe_open = set(self._pe_pos)  # PE groups with an engine at or under beta (all, at start)
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

    def check_invariants(self) -> None:
        """The PE open set matches the engines' tok_e (the ledgers behind it are checked by the
        simulator)."""
        for node in self.sim.prefill_nodes:
            is_open = min(e.num_tokens for e in node.engines) <= self.thresholds.beta_tokens
            if is_open != (node.nid in self._pe_open):
                raise AssertionError(f"PE group {node.nid}: open set says {not is_open}, engines say {is_open}")
        for node in self.sim.decode_nodes:
            if self._de_totals[node.nid] != sum(e.num_tokens for e in node.engines):
                raise AssertionError(f"DE group {node.nid}: phase-1 total {self._de_totals[node.nid]} is stale")

    # --- 1. PE selection --------------------------------------------------------------------
    def _fetch_prefill(self) -> None:
        sim = self.sim
        groups = sim.prefill_nodes
        n = len(groups)
        start = self._pe_turn
        self._pe_turn = (self._pe_turn + 1) % n
        engines_by_id = sim.engines_by_id
        # Rotating walk from `start` over the groups that have an engine at or under beta: a group
        # whose engines are all over beta would assign nothing, so skipping it is the same walk.
        # Only the group being fetched changes during the walk, so the order can be fixed up front.
        for k in sorted((self._pe_pos[g] - start) % n for g in self._pe_open):
            if not self.pe_queue:
                break
            node = groups[(start + k) % n]
            loads = [e.load() for e in node.engines]
            views = (r.qview for r in self.pe_queue)
            if sim.features.dualpath_scheduler:
                # a PE group is one node, so its engines report one read queue
                out = select_prefill(loads, {node.nid: node.read_queue_tokens}, views, self.thresholds)
            else:
                out, self._rr_pe = round_robin_prefill(loads, views, self.thresholds.beta_tokens, self._rr_pe)
            for a in out:
                req = self.pe_queue.popleft()
                assert req.rid == a.rid, "PE assignment must follow FIFO order"
                eng = engines_by_id[a.engine]
                req.pe = eng
                eng.take(req.input_tokens)
                req.t_pe = sim.loop.now_s
                req.to(Phase.PE_ASSIGNED)
                self.de_queue.append(req)
                self.num_decisions += 1
            self._update_pe_open(node)

    def de_released(self, node: Node) -> None:
        """A DE of `node` finished a request: its tokens and HBM are back, so the group fetches."""
        self._de_totals[node.nid] = sum(e.num_tokens for e in node.engines)
        self.dirty.add(node.nid)
        self.kick()

    def pe_released(self, node: Node) -> None:
        """A PE of `node` finished a request (its tok_e dropped)."""
        self._update_pe_open(node)

    def _update_pe_open(self, node: Node) -> None:
        if min(e.num_tokens for e in node.engines) <= self.thresholds.beta_tokens:
            self._pe_open.add(node.nid)
        else:
            self._pe_open.discard(node.nid)

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
            placed = distribute_to_groups(self._de_totals, (r.qview for r in self.de_queue))
            for ga in placed:
                req = self.de_queue.popleft()
                assert req.rid == ga.rid
                self.private[ga.group].append(req)
                self.dirty.add(ga.group)
        n = len(groups)
        start = self._de_turn
        self._de_turn = (self._de_turn + 1) % n
        # Visit groups in rotating order from `start`, fetching for those dirty when reached.
        # Jumping straight to the next dirty position (rather than testing every group) is the
        # same walk: a group made dirty during the pass is fetched iff its turn is still ahead.
        k = 0
        while self.dirty:
            ahead = [p for p in ((self._de_pos[g] - start) % n for g in self.dirty) if p >= k]
            if not ahead:
                break
            k = min(ahead)
            node = groups[(start + k) % n]
            k += 1
            q = self.private[node.nid]
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
        eng.take(req.de_len_tokens, req.hbm_bytes)
        self._de_totals[eng.node.nid] = sum(e.num_tokens for e in eng.node.engines)
        req.t_de = sim.loop.now_s
        self.num_decisions += 1
        self._choose_side_and_read(req)

    # --- 3. read side -----------------------------------------------------------------------
    def _choose_side_and_read(self, req: SimRequest) -> None:
        sim = self.sim
        sim.resolve_hit(req)
        assert req.pe is not None and req.de is not None
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
