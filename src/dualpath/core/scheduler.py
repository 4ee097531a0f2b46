"""The global scheduler: the one scheduling pass of both worlds (docs/paper.md §3), pure.

The router (runtime/router/router.py) and the simulator (sim/dispatch.py) hold no queue and make
no choice of their own: they submit requests, report releases, and apply the `SchedulePass` that
`schedule(view)` returns. No clock and no I/O here; the world answers the few questions of a
`ClusterView` (engine loads of a group, a node's read queue, a request's hit) at the moment of
the pass.

A group is the engines of one node and shares the node's id (docs/paper.md §3.1). One pass:
  1. PE groups fetch from the global FIFO queue, in a rotation that starts one group later each
     pass, skipping groups whose engines are all over beta (they would assign nothing).
     DualPath: Algorithm 1 (`select_prefill`); otherwise round robin under the same beta cap.
     Requests keep global FIFO order.
  2. DE groups fetch. DualPath: phase 1 drains the global DE queue, each request to the group
     with the least total tokens (`distribute_to_groups`); then the groups whose private queue
     or HBM changed since their last fetch (the dirty set) assign in-group with HBM fit and Z
     (`select_decode`), in the same kind of rotation. Otherwise: round robin with HBM fit over all
     DEs.
  3. Each DE assignment gets its read side: a forced side if the configuration names one; the PE
     side without the DE read path; DualPath: the shorter node read queue (`choose_read_side`),
     counting the reads this pass already sent there; otherwise alternating. With a
     RecomputeRule, a hit that the side's store would deliver later than a PE computes it again
     is recomputed instead (`should_recompute`: no read, nothing added to a queue). With a
     SplitRule (`dualpath+split`, beyond the paper), a read hit is cut between the two nodes so
     that both finish together (`split_read`: a PE-side prefix, a DE-side suffix); each node's
     queue is charged with its own part. With a DRAM tier (`+dram`, beyond the paper), each
     side's cost adds the hit tokens its DRAM does not hold (`side_cost_tokens`; a side holding
     the whole hit costs nothing), and a node's queue is charged only with what it reads from
     storage.
  With a local-prefill threshold (`+selective`, beyond the paper), a request whose uncached tokens
  are at most it skips step 1 at `submit`: it joins the DE queue with no PE, its DE is chosen in
  step 2 as any request's (`prefill_locally`). Its hit is read on its DE's node; with DualPath's
  rules, the read-side rule may instead send it through the PE node with the shortest read queue,
  which relays it to the DE over the CNICs (DualPath's second path, mirrored).

Where the two worlds' former copies differed, this follows the paper and the simulator, which
already did: (a) the fetch order rotates (the router walked engines in id order; the paper has
every group's leader fetch periodically, none first by rank); (b) the read side is chosen when the
DE is chosen, with the request's hit added to that node's read queue at once (the router chose
it later, at buffer placement); (c) DE groups fetch only when dirty (the router re-ran phase 2 on
every non-empty private queue: the same decisions, since an unchanged group assigns nothing new).
The runtime's forced side (`force_read_side`, a test and benchmark knob) is kept.

Engines pull periodically in the paper; an event-driven pass is the limit of a short period.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final, Iterable, Sequence, final

from mypy_extensions import mypyc_attr

from .policy import (
    PrefillThresholds,
    RecomputeRule,
    RoundRobinCursor,
    SplitRule,
    choose_read_side,
    side_cost_tokens,
    distribute_to_groups,
    prefill_locally,
    round_robin_decode,
    round_robin_prefill,
    round_robin_read_side,
    select_decode,
    select_prefill,
    should_recompute,
    split_read,
)
from .policy.decode import Z_FACTOR_DEFAULT
from .policy.tail import share_cap
from .request import RequestId
from .snapshot import EngineLoad, GroupLoad, QueuedRequest, ReadSide

_NO_ALPHA_TOKENS = 2**62  # alpha when reads cost nothing (the oracle): every read queue is short
_LOCAL = -1  # _Entry.pe_node of a request prefilled on its DE (no PE node)


def derive_thresholds(alpha_read_s: float, beta_compute_s: float, snic_bytes_per_s: float | None,
                      kv_bytes_per_token: int, prefill_tokens_per_s: float) -> PrefillThresholds:
    """alpha: the tokens a node's SNIC reads in `alpha_read_s` (3 s); beta: the prompt tokens one PE
    processes in `beta_compute_s` (5 s) (docs/paper.md §3.2, §5). `snic_bytes_per_s` None: a free network."""
    alpha = int(alpha_read_s * snic_bytes_per_s / kv_bytes_per_token) if snic_bytes_per_s else _NO_ALPHA_TOKENS
    return PrefillThresholds(alpha, max(1, int(beta_compute_s * prefill_tokens_per_s)))


@mypyc_attr(allow_interpreted_subclasses=True)
class ClusterView:
    """What the scheduler asks the world during a pass; answers reflect every decision applied
    before the pass (not those of the pass itself, which the scheduler tracks). Each world
    subclasses it (sim/dispatch.py:SimView, runtime/router/state.py:RouterView): a base class
    rather than a Protocol, so that the compiled simulator's calls stay native."""

    def pe_loads(self, group: int) -> Sequence[EngineLoad]:
        raise NotImplementedError

    def de_loads(self, group: int) -> Sequence[EngineLoad]:
        raise NotImplementedError

    def read_queue_tokens(self, node: int) -> int:
        raise NotImplementedError

    def read_tokens(self, ref: Any) -> int:
        """Tokens the request's read will add to its side's read queue (its hit; 0: no read);
        `ref` is the world's record given to `submit`."""
        raise NotImplementedError

    def dram_tokens(self, ref: Any, node: int, hit_tokens: int) -> int:
        """Tokens of the request's hit (`hit_tokens`, as `read_tokens` said) that `node`'s DRAM tier
        holds (core/dram.py); asked only with `+dram`."""
        return 0

    def store_latency_s(self, node: int) -> float:
        """Seconds before a read from `node` gets its first byte (read or recompute,
        core/policy/recompute.py); asked only when the rules carry a RecomputeRule."""
        return 0.0


@dataclass(frozen=True, slots=True)
class SchedulerRules:
    """How a mode schedules, chosen once. Filled from SchedulerConfig/RuntimeConfig and Features."""

    thresholds: PrefillThresholds  # alpha, beta in tokens (derive_thresholds)
    dualpath: bool = True  # Algorithm 1, two-phase DE, shorter read queue; False: round robin
    de_read_path: bool = True  # False: every read on the PE side (the basic system)
    z_factor: float = Z_FACTOR_DEFAULT  # docs/paper.md §3.3
    forced_side: ReadSide | None = None  # every read on this side (runtime knob for tests, benches)
    recompute: RecomputeRule | None = None  # read or recompute a hit (policy/recompute.py); None: always read
    split: SplitRule | None = None  # split a hit between the sides (policy/split.py; with dualpath only); None: never
    tail_share: bool = False  # +tail: a burst spread over the open PE groups (policy/tail.py); False: Algorithm 1
    local_max_tokens: int | None = None  # +selective: prefill on the DE at most this many uncached tokens (policy/local.py)
    dram_tier: bool = False  # +dram: the read-side rule counts what each side's DRAM tier holds (policy/read_side.py)


@final
class PrefillAssignment:
    """A PE choice. Read-only (Final: mypy refuses a write); a slotted class rather than a
    NamedTuple, whose constructor is Python code even in the compiled build."""

    __slots__ = ("req", "ref", "engine")

    def __init__(self, req: QueuedRequest, ref: Any, engine: int) -> None:
        self.req: Final = req  # the request as the scheduler saw it
        self.ref: Final = ref  # the world's record of it, as given to `submit` (never read here)
        self.engine: Final = engine  # the PE that takes it: tok_e += num_tokens, seq_e += 1


@final
class DecodeAssignment:
    """A DE choice with its read side; read-only like PrefillAssignment."""

    __slots__ = ("req", "ref", "engine", "side", "read_tokens", "recompute", "pe_part_tokens", "local", "relay_node",
                 "pe_cost_tokens", "de_cost_tokens")

    def __init__(self, req: QueuedRequest, ref: Any, engine: int, side: ReadSide, read_tokens: int,
                 recompute: bool = False, pe_part_tokens: int = 0, local: bool = False, relay_node: int = -1,
                 pe_cost_tokens: int = -1, de_cost_tokens: int = -1) -> None:
        self.req: Final = req  # the request as the scheduler saw it
        self.ref: Final = ref  # the world's record of it
        self.engine: Final = engine  # the DE that takes it: tok_e += decode_tokens, seq_e += 1, free HBM -= hbm_bytes
        self.side: Final = side  # where its hit KV is read (a split read: DECODE, with a PE-side part)
        self.read_tokens: Final = read_tokens  # tokens added to the read side's node queue (view.read_tokens at the pass)
        self.recompute: Final = recompute  # the hit is computed again, not read (read_tokens 0)
        # a split read (policy/split.py): the prefix of read_tokens the PE node reads, the rest
        # charged to the DE node; 0: not split
        self.pe_part_tokens: Final = pe_part_tokens
        self.local: Final = local  # prefilled on this DE (+selective): no PE took it
        # a local request read on the PE side (side PREFILL): the PE node that reads its hit and
        # relays it to the DE over the CNICs; -1: none (read on the DE's node)
        self.relay_node: Final = relay_node
        # what the read-side rule compared (policy/read_side.py): each side's read queue, with
        # `+dram` plus what it must read from storage (0: its DRAM holds the whole hit); -1: no
        # comparison (basic, a forced side, round robin)
        self.pe_cost_tokens: Final = pe_cost_tokens
        self.de_cost_tokens: Final = de_cost_tokens


_NONE: tuple = ()


@final
class SchedulePass:
    """The decisions of one pass, in the order made; the world applies them in this order.
    Read-only, like the assignments (core/record.py says why not a frozen dataclass)."""

    __slots__ = ("prefill", "decode")

    def __init__(self, prefill: tuple[PrefillAssignment, ...], decode: tuple[DecodeAssignment, ...]) -> None:
        self.prefill: Final = prefill  # PE choices, in global FIFO order
        self.decode: Final = decode  # DE choices with their read sides


_EMPTY_PASS = SchedulePass(_NONE, _NONE)
class _Entry:
    """A queued request: the scheduler's view of it and the world's record, one object from the
    global PE queue through the DE queues (not a tuple per queue: passes stay allocation-light)."""

    __slots__ = ("req", "ref", "pe_node")

    def __init__(self, req: QueuedRequest, ref: Any) -> None:
        self.req = req
        self.ref = ref
        self.pe_node = 0  # its PE's node; set when the PE is chosen (_LOCAL: none), read only in the DE queues


class GlobalScheduler:
    def __init__(self, pe_groups: Sequence[int], de_groups: Sequence[int], rules: SchedulerRules) -> None:
        if not pe_groups or not de_groups:
            raise ValueError("the scheduler needs at least one PE group and one DE group")
        self.rules = rules
        self._pe_groups = tuple(pe_groups)
        self._de_groups = tuple(de_groups)
        self._de_pos = {g: i for i, g in enumerate(self._de_groups)}
        self._pe_queue: deque[_Entry] = deque()  # the global FIFO queue
        self._de_queue: deque[_Entry] = deque()  # PE chosen, no DE group yet
        self._private: dict[int, deque[_Entry]] = {g: deque() for g in self._de_groups}  # phase-1 queues
        self._dirty: set[int] = set()  # DE groups whose queue or HBM changed since their last fetch
        self._pe_open: set[int] = set(self._pe_groups)  # PE groups with an engine at or under beta
        self._de_totals = {g: 0 for g in self._de_groups}  # phase 1's sum of tok_e per DE group
        self._pe_turn = 0
        self._de_turn = 0
        self._rr_pe = RoundRobinCursor()
        self._rr_de = RoundRobinCursor()
        self._rr_side = RoundRobinCursor()
        self.num_passes = 0
        self.num_decisions = 0

    # --- what the world reports -----------------------------------------------------------------
    def submit(self, req: QueuedRequest, ref: Any) -> None:
        """A new request joins the global FIFO queue; `ref` (the world's record of it) comes back
        with its assignments, so that applying them needs no lookup. A request the local-prefill
        rule keeps on a DE (`+selective`) joins the DE queue instead, with no PE."""
        entry = _Entry(req, ref)
        local = self.rules.local_max_tokens
        if local is not None and prefill_locally(local, req.uncached_tokens):
            entry.pe_node = _LOCAL
            self._de_queue.append(entry)
        else:
            self._pe_queue.append(entry)

    def cancel(self, rid: RequestId) -> bool:
        """Drop a request that no engine has taken from its queue; True if it was queued."""
        for queued in self._pe_queue:
            if queued.req.rid == rid:
                self._pe_queue.remove(queued)
                return True
        for q in (self._de_queue, *self._private.values()):
            for item in q:
                if item.req.rid == rid:
                    q.remove(item)
                    return True
        return False

    def pe_released(self, group: int, least_tokens: int) -> None:
        """A PE of `group` finished (or dropped) a request: its tok_e fell; `least_tokens` is the
        least tok_e among the group's engines now."""
        self._set_open(group, least_tokens)

    def de_released(self, group: int, group_tokens: int) -> None:
        """A DE of `group` finished (or dropped) a request: its tokens and HBM are back;
        `group_tokens` is the sum of the group's tok_e now."""
        self._de_totals[group] = group_tokens
        self._dirty.add(group)

    @property
    def num_pe_queued(self) -> int:
        return len(self._pe_queue)

    @property
    def num_de_queued(self) -> int:
        return len(self._de_queue) + sum(len(q) for q in self._private.values())

    # --- the pass -------------------------------------------------------------------------------
    def schedule(self, view: ClusterView) -> SchedulePass:
        self.num_passes += 1
        prefill = tuple(self._fetch_prefill(view)) if self._pe_queue else _NONE
        decode: list[DecodeAssignment] = []
        if self._de_queue or self._dirty:
            if self.rules.dualpath:
                self._fetch_decode_dualpath(view, decode)
            else:
                self._fetch_decode_round_robin(view, decode)
        if not prefill and not decode:
            return _EMPTY_PASS
        self.num_decisions += len(prefill) + len(decode)
        return SchedulePass(prefill, tuple(decode))

    # 1. PE selection
    def _fetch_prefill(self, view: ClusterView) -> list[PrefillAssignment]:
        groups = self._pe_groups
        n = len(groups)
        start = self._pe_turn
        self._pe_turn = (start + 1) % n
        out: list[PrefillAssignment] = []
        cap = share_cap(len(self._pe_queue), len(self._pe_open)) if self.rules.tail_share else None
        if cap is None:  # the open groups in turn from `start`, until the queue is empty
            is_open = self._pe_open  # only the group being fetched changes during the walk
            for k in range(n):
                if not self._pe_queue:
                    break
                group = groups[(start + k) % n]
                if group in is_open:
                    self._fetch_group(view, group, view.pe_loads(group), None, out)
            return out
        # the open groups in turn from `start`, fixed up front: the second sweep visits the first's
        order = [g for g in (groups[(start + k) % n] for k in range(n)) if g in self._pe_open]
        # +tail (policy/tail.py): a capped sweep, then the groups still open take what is left
        added: dict[int, dict[int, int]] = {}
        for group in order:
            if not self._pe_queue:
                break
            added[group] = self._fetch_group(view, group, view.pe_loads(group), cap, out)
        for group in order:
            if not self._pe_queue:
                break
            if group in self._pe_open:
                more = added.get(group, {})
                loads = [EngineLoad(e.engine, e.node, e.num_seqs, e.num_tokens + more.get(e.engine, 0), e.free_hbm_bytes)
                         for e in view.pe_loads(group)]
                self._fetch_group(view, group, loads, None, out)
        return out

    def _fetch_group(self, view: ClusterView, group: int, loads: Sequence[EngineLoad], cap: int | None,
                     out: list[PrefillAssignment]) -> dict[int, int]:
        """One group's selection over the queue's head (at most `cap` requests): its assignments
        into `out`, its tokens added per engine returned."""
        rules = self.rules
        queue: Iterable[QueuedRequest] = (w.req for w in self._pe_queue)
        if cap is not None:
            queue = islice(queue, cap)
        if rules.dualpath:
            got = select_prefill(loads, {group: view.read_queue_tokens(group)}, queue, rules.thresholds)
        else:
            got, self._rr_pe = round_robin_prefill(loads, queue, rules.thresholds.beta_tokens, self._rr_pe)
        added: dict[int, int] = {}
        for a in got:
            entry = self._pe_queue.popleft()
            req = entry.req
            assert req.rid is a.rid, "PE assignment must follow FIFO order"
            added[a.engine] = added.get(a.engine, 0) + req.num_tokens
            entry.pe_node = group
            self._de_queue.append(entry)
            out.append(PrefillAssignment(req, entry.ref, a.engine))
        if added:  # (a list, not a generator: this runs at every fetch)
            self._set_open(group, min([e.num_tokens + added.get(e.engine, 0) for e in loads]))
        return added

    def _set_open(self, group: int, least_tokens: int) -> None:
        """A PE group is open while one of its engines is at or under beta."""
        if least_tokens <= self.rules.thresholds.beta_tokens:
            self._pe_open.add(group)
        else:
            self._pe_open.discard(group)

    # 2. DE selection
    def _fetch_decode_dualpath(self, view: ClusterView, out: list[DecodeAssignment]) -> None:
        de_queue, private, dirty = self._de_queue, self._private, self._dirty
        if de_queue:
            for ga in distribute_to_groups(self._de_totals, [w.req for w in de_queue]):
                item = de_queue.popleft()
                assert item.req.rid is ga.rid
                private[ga.group].append(item)
                dirty.add(ga.group)
        groups = self._de_groups
        n = len(groups)
        start = self._de_turn
        self._de_turn = (start + 1) % n
        reads: dict[int, int] = {}  # read tokens this pass sent to each node
        # Visit dirty groups in rotating order from `start` (no group turns dirty during the walk).
        for k in sorted((self._de_pos[g] - start) % n for g in self._dirty):
            group = groups[(start + k) % n]
            self._dirty.discard(group)
            q = self._private[group]
            if not q:
                continue
            loads = view.de_loads(group)
            if max([e.free_hbm_bytes for e in loads]) < q[0].req.hbm_bytes:
                continue  # no DE fits the head: phase 2 would assign nothing
            snap = GroupLoad(group, tuple(loads))
            for a in select_decode(snap, _fitting_prefix(q, snap), self.rules.z_factor):
                w = q.popleft()
                assert w.req.rid is a.rid
                out.append(self._decided(w, group, a.engine, view, reads))

    def _fetch_decode_round_robin(self, view: ClusterView, out: list[DecodeAssignment]) -> None:
        self._dirty.clear()
        if not self._de_queue:
            return
        loads = [e for g in self._de_groups for e in view.de_loads(g)]
        node_of = {e.engine: e.node for e in loads}
        got, self._rr_de = round_robin_decode(loads, (w.req for w in self._de_queue), self._rr_de)
        reads: dict[int, int] = {}
        for a in got:
            w = self._de_queue.popleft()
            assert w.req.rid is a.rid
            out.append(self._decided(w, node_of[a.engine], a.engine, view, reads))

    # 3. read side
    def _decided(self, w: _Entry, de_node: int, engine: int, view: ClusterView, reads: dict[int, int]) -> DecodeAssignment:
        req, ref, pe_node = w.req, w.ref, w.pe_node
        self._de_totals[de_node] += req.decode_tokens
        if pe_node == _LOCAL:
            return self._decided_local(w, de_node, engine, view, reads)
        rules = self.rules
        pe_queue = de_queue = -1  # the queues the read-side rule compared (dualpath only)
        pe_cost = de_cost = -1  # what it compared them as (with `+dram`: plus the storage reads)
        tokens = -1  # the hit, once asked
        if rules.forced_side is not None:
            side = rules.forced_side
        elif not rules.de_read_path:
            side = ReadSide.PREFILL
        elif rules.dualpath:
            pe_queue, de_queue = view.read_queue_tokens(pe_node), view.read_queue_tokens(de_node)
            if reads:  # what this pass already sent to either node
                pe_queue += reads.get(pe_node, 0)
                de_queue += reads.get(de_node, 0)
            if rules.dram_tier:
                tokens = view.read_tokens(ref)
                pe_cost = side_cost_tokens(pe_queue, tokens - view.dram_tokens(ref, pe_node, tokens))
                de_cost = side_cost_tokens(de_queue, tokens - view.dram_tokens(ref, de_node, tokens))
            else:
                pe_cost, de_cost = pe_queue, de_queue
            side = choose_read_side(pe_cost, de_cost)
        else:
            side, self._rr_side = round_robin_read_side(self._rr_side)
        if tokens < 0:
            tokens = view.read_tokens(ref)
        if not tokens:
            return DecodeAssignment(req, ref, engine, side, 0, pe_cost_tokens=pe_cost, de_cost_tokens=de_cost)
        node = pe_node if side is ReadSide.PREFILL else de_node
        rule = rules.recompute
        if rule is not None and should_recompute(rule, tokens, view.store_latency_s(node)):
            return DecodeAssignment(req, ref, engine, side, 0, True, pe_cost_tokens=pe_cost, de_cost_tokens=de_cost)
        if rules.split is not None and pe_queue >= 0:
            pe_part = split_read(rules.split, tokens, pe_queue, de_queue, side)
            if 0 < pe_part < tokens:  # both nodes read: each queue charged with its own part
                reads[pe_node] = reads.get(pe_node, 0) + pe_part
                reads[de_node] = reads.get(de_node, 0) + tokens - pe_part
                return DecodeAssignment(req, ref, engine, ReadSide.DECODE, tokens, False, pe_part,
                                        pe_cost_tokens=pe_cost, de_cost_tokens=de_cost)
            side, node = (ReadSide.PREFILL, pe_node) if pe_part else (ReadSide.DECODE, de_node)
        reads[node] = reads.get(node, 0) + (tokens - view.dram_tokens(ref, node, tokens) if rules.dram_tier else tokens)
        return DecodeAssignment(req, ref, engine, side, tokens, pe_cost_tokens=pe_cost, de_cost_tokens=de_cost)

    def _decided_local(self, w: _Entry, de_node: int, engine: int, view: ClusterView, reads: dict[int, int]) -> DecodeAssignment:
        """A request prefilled on its DE: its hit read whole on the DE's node or, with DualPath's
        rules, on the PE node with the shortest read queue when that queue is strictly shorter (the
        read-side rule of policy/read_side.py, a tie kept on the DE's node: no relay hop), which
        relays it to the DE over the CNICs."""
        tokens = view.read_tokens(w.ref)
        node, side = de_node, ReadSide.DECODE
        pe_queue = de_queue = -1  # the costs compared (the nearest PE node's), as in `_decided`
        rules = self.rules
        dram = rules.dram_tier
        if tokens and rules.dualpath and rules.de_read_path and rules.forced_side is None:
            if dram:  # each side's queue plus what it must read from storage (policy/read_side.py)
                de_queue = side_cost_tokens(view.read_queue_tokens(de_node) + reads.get(de_node, 0),
                                            tokens - view.dram_tokens(w.ref, de_node, tokens))
                pe_queue, relay = min((side_cost_tokens(view.read_queue_tokens(g) + reads.get(g, 0),
                                                        tokens - view.dram_tokens(w.ref, g, tokens)), g) for g in self._pe_groups)
            else:
                de_queue = view.read_queue_tokens(de_node) + reads.get(de_node, 0)
                pe_queue, relay = min((view.read_queue_tokens(g) + reads.get(g, 0), g) for g in self._pe_groups)
            if pe_queue < de_queue:
                node, side = relay, ReadSide.PREFILL
        if tokens:
            reads[node] = reads.get(node, 0) + (tokens - view.dram_tokens(w.ref, node, tokens) if dram else tokens)
        return DecodeAssignment(w.req, w.ref, engine, side, tokens, local=True,
                                relay_node=node if side is ReadSide.PREFILL else -1,
                                pe_cost_tokens=pe_queue, de_cost_tokens=de_queue)

    # --- ledgers --------------------------------------------------------------------------------
    def check_invariants(self, view: ClusterView) -> None:
        """The open set and the phase-1 totals match the engines; every queued request is queued
        once."""
        beta = self.rules.thresholds.beta_tokens
        for g in self._pe_groups:
            is_open = min(e.num_tokens for e in view.pe_loads(g)) <= beta
            if is_open != (g in self._pe_open):
                raise AssertionError(f"PE group {g}: open set says {not is_open}, engines say {is_open}")
        for g in self._de_groups:
            if self._de_totals[g] != sum(e.num_tokens for e in view.de_loads(g)):
                raise AssertionError(f"DE group {g}: phase-1 total {self._de_totals[g]} is stale")
        rids = [w.req.rid for w in self._pe_queue] + [w.req.rid for w in self._de_queue]
        rids += [w.req.rid for q in self._private.values() for w in q]
        if len(rids) != len(set(rids)):
            raise AssertionError("a request is queued twice")


def _fitting_prefix(q: Iterable[_Entry], group: GroupLoad) -> list[QueuedRequest]:
    """The head of a private queue that phase 2 can touch: the requests whose running HBM sum
    fits the group's total free HBM (step 1's R), plus the first that does not. Nothing past it
    can be assigned in this fetch, and R over this prefix equals R over the whole queue, so
    passing only this prefix is exact and keeps a pass O(assignable) instead of O(queue)."""
    free = sum([e.free_hbm_bytes for e in group.engines])
    out = []
    for w in q:
        req = w.req
        out.append(req)
        free -= req.hbm_bytes
        if free < 0:
            break
    return out
