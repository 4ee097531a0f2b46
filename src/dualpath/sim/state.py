"""Mutable simulator state: agents, requests, engines and nodes (plain slotted classes, hot path).

Ownership: the `Simulator` creates and mutates these; policies only ever see frozen snapshots
built from them (`EngineLoad`, `QueuedRequest`, `BatchCandidate`).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from ..core.phase import LEGAL_TRANSITIONS, Phase, check_transition
from ..core.request import RequestId
from ..core.snapshot import EngineLoad, QueuedRequest, ReadSide
from ..metrics.timeline import engine_tracks, snic_tracks
from .dram import NO_TIER, NoTier
from .links import Link


class Agent:
    __slots__ = ("aid", "turns", "next_turn", "context_tokens", "persisted_tokens", "arrival_s", "finish_s")

    def __init__(self, aid: int, turns: tuple, arrival_s: float) -> None:
        self.aid = aid
        self.turns = turns  # tuple[TurnSpec, ...]
        self.next_turn = 0
        self.context_tokens = 0  # tokens of all finished turns (appends + generations)
        self.persisted_tokens = 0  # block-aligned prefix that is durable in storage
        self.arrival_s = arrival_s
        self.finish_s = -1.0


class SimRequest:
    __slots__ = (
        "rid", "agent", "input_tokens", "gen_tokens", "hit_tokens", "cached_tokens", "remaining_tokens",
        "phase", "pe", "de", "side", "pe_part_tokens", "local", "relay", "read_parts", "hit_sent", "pending_pd", "computed", "qview",
        "pe_buffer_bytes", "de_buffer_bytes", "hbm_bytes", "delivered_bytes",
        "t_arrival", "t_pe", "t_de", "t_read_start", "t_read_end", "t_prefill_start", "t_first", "t_second", "t_finish",
    )

    def __init__(self, agent: Agent, turn: int, input_tokens: int, gen_tokens: int, hbm_bytes: int, now_s: float) -> None:
        self.rid = RequestId(agent.aid, turn)
        self.agent = agent
        self.input_tokens = input_tokens
        self.gen_tokens = gen_tokens
        self.hit_tokens = 0
        self.cached_tokens = 0
        self.remaining_tokens = input_tokens
        self.phase = Phase.QUEUED
        self.pe: Engine | None = None
        self.de: Engine | None = None
        self.side = ReadSide.PREFILL
        self.pe_part_tokens = 0  # a split read (side DECODE): the hit's prefix the PE node reads; 0: not split
        self.local = False  # prefilled on its DE, no PE (+selective, core/policy/local.py)
        self.relay: Node | None = None  # a local request read on the PE side: the PE node that reads and relays its hit
        self.read_parts: list[ReadPart] = []  # its reads queued or running (reads.py)
        self.hit_sent = False
        self.pending_pd = 0
        self.computed = False
        self.pe_buffer_bytes = 0.0
        self.de_buffer_bytes = 0.0
        self.hbm_bytes = hbm_bytes
        self.delivered_bytes = 0.0  # prompt KV bytes that reached the DE buffer (ledger)
        # the policies read len(r) as the prompt length; a DE's tok_e grows by the final length
        self.qview = QueuedRequest(self.rid, input_tokens, hbm_bytes, input_tokens + gen_tokens)
        self.t_arrival = now_s
        self.t_pe = self.t_de = self.t_read_start = self.t_read_end = -1.0
        self.t_prefill_start = self.t_first = self.t_second = self.t_finish = -1.0

    def set_hit(self, tokens: int) -> None:
        """The usable hit (tokens) is fixed: at the DE's choice, or again at placement (persists.py)."""
        self.hit_tokens = self.cached_tokens = tokens
        self.remaining_tokens = self.input_tokens - tokens

    def to(self, phase: Phase) -> None:
        if phase not in LEGAL_TRANSITIONS[self.phase]:  # `check_transition`'s test, inlined (a per-phase hot path)
            check_transition(self.phase, phase)  # raises
        self.phase = phase

    @property
    def de_len_tokens(self) -> int:
        return self.input_tokens + self.gen_tokens

    @property
    def pe_side_node(self) -> "Node":
        """The node whose buffer holds a PE-side read: its PE's, or a local request's relay."""
        if self.pe is not None:
            return self.pe.node
        if self.relay is None:
            raise AssertionError(f"{self.rid}: no PE and no relay node")
        return self.relay

    @property
    def chosen_de(self) -> Engine:
        """The DE the dispatch chose (from the scheduling pass on)."""
        if self.de is None:
            raise AssertionError(f"{self.rid}: no DE chosen yet")
        return self.de


class ReadPart:
    """A read of some of a request's hit on one node's SNIC: the whole hit, or one part of a split;
    tokens [first, first + tokens) of the prompt, `storage_tokens` of them not in the node's DRAM
    tier (`+dram`; all of them otherwise), what its SNIC reads and its read queue counts."""

    __slots__ = ("req", "side", "first", "tokens", "storage_tokens", "node", "start_s")

    def __init__(self, req: SimRequest, side: ReadSide, first: int, tokens: int, node: "Node") -> None:
        self.req = req
        self.side = side
        self.first = first
        self.tokens = tokens
        self.storage_tokens = tokens
        self.node = node
        self.start_s = -1.0  # when its reader took it


class Engine:
    """One GPU: a PE or a DE. CNIC links are this GPU's paired NIC, one per direction:
    `cnic_out` carries bytes the NIC reads from host or GPU memory, `cnic_in` bytes it writes."""

    __slots__ = (
        "eid", "node", "index", "num_seqs", "num_tokens", "hbm_total_bytes", "hbm_free_bytes", "cnic_out", "cnic_in",
        "batch_queue", "_load", "track", "cnic_track",
    )

    def __init__(self, eid: int, node: "Node", index: int, hbm_total_bytes: float, cnic_out: Link, cnic_in: Link,
                 role_index: int) -> None:
        self.eid = eid
        self.track, self.cnic_track = engine_tracks(node.is_prefill, role_index)  # the timeline's, within the role
        self.node = node
        self.index = index
        self.num_seqs = 0
        self.num_tokens = 0
        self.hbm_total_bytes = hbm_total_bytes
        self.hbm_free_bytes = hbm_total_bytes
        self.cnic_out = cnic_out
        self.cnic_in = cnic_in
        self.batch_queue: deque[SimRequest] = deque()  # PE only: requests with KV ready, FIFO
        self._load: EngineLoad | None = None  # snapshot of the counters below, rebuilt after a change

    # seq_e, tok_e and free HBM change only through take/release, which keep the cached snapshot
    # in step (check_invariants compares it with the counters).
    def take(self, tokens: int, hbm_bytes: int = 0) -> None:
        self.num_seqs += 1
        self.num_tokens += tokens
        self.hbm_free_bytes -= hbm_bytes
        self._load = None
        self.node._loads = None

    def release(self, tokens: int, hbm_bytes: int = 0) -> None:
        self.num_seqs -= 1
        self.num_tokens -= tokens
        self.hbm_free_bytes += hbm_bytes
        self._load = None
        self.node._loads = None

    def load(self) -> EngineLoad:
        if self._load is None:
            self._load = EngineLoad(self.eid, self.node.nid, self.num_seqs, self.num_tokens, int(self.hbm_free_bytes))
        return self._load


class Node:
    """A node: a group of engines of one role sharing one SNIC (per direction) and a DRAM buffer."""

    __slots__ = (
        "nid", "is_prefill", "engines", "snic_in", "snic_out", "buffer_total_bytes", "buffer_free_bytes",
        "read_queue", "read_queue_tokens", "reads_active", "waiters", "read_track", "write_track", "_loads", "dram",
    )

    def __init__(self, nid: int, is_prefill: bool, snic_in: Link, snic_out: Link, buffer_bytes: float) -> None:
        self.nid = nid
        self.read_track, self.write_track = snic_tracks(nid)  # the timeline's (metrics/timeline.py)
        self.is_prefill = is_prefill
        self.engines: list[Engine] = []
        self.snic_in = snic_in
        self.snic_out = snic_out
        self.buffer_total_bytes = buffer_bytes
        self.buffer_free_bytes = buffer_bytes
        self.read_queue: deque[ReadPart] = deque()
        self.read_queue_tokens = 0  # hit tokens queued or being read here (the policy's read_q)
        self.reads_active = 0
        # things blocked on this node's buffer, by id: a Node (its reader) or a PrefillGroup
        self.waiters: dict[int, Any] = {}
        self._loads: list[EngineLoad] | None = None  # its engines' `load()`, until one of them changes
        self.dram: NoTier = NO_TIER  # its host-DRAM tier (`+dram`, dram.py; the simulator sets it once)

    def loads(self) -> list[EngineLoad]:
        """`Engine.load()` of each engine (a new list; the snapshots are rebuilt only after a change)."""
        loads = self._loads
        if loads is None:
            loads = self._loads = [e.load() for e in self.engines]
        return loads.copy()

    def reserve(self, nbytes: float) -> bool:
        if nbytes > self.buffer_free_bytes:
            return False
        self.buffer_free_bytes -= nbytes
        return True
