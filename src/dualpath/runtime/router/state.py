"""The router's records: one per engine, one per request, and the view the scheduler asks.

Both records are changed only on the router's event loop. `RouterView` answers the scheduler's
questions (`core.scheduler.ClusterView`) from them: every engine is its own group and node here.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from typing import Callable, Iterable

from ...config import CNIC_PER_SNIC, RuntimeConfig
from ...core.policy import RecomputeRule, SplitRule
from ...core.scheduler import ClusterView, GlobalScheduler, SchedulerRules, derive_thresholds
from ...core.phase import IllegalTransition, Phase, check_transition
from ...core.snapshot import EngineLoad, QueuedRequest, ReadSide
from ..api import GenerationRequest
from ..protocol import EngineRole, FirstToken
from ..transport.channel import Outbox
from .placement import Placement


@dataclass(slots=True)
class EngineState:
    engine: int
    role: EngineRole
    endpoint: str
    kv_capacity_tokens: int = 0
    kv_reserved_tokens: int = 0
    num_seqs: int = 0
    num_tokens: int = 0
    read_queue_tokens: int = 0
    prefill_tokens_per_s: float = 0.0
    outbox: Outbox | None = None
    data_endpoint: str = ""  # where peers write into it across hosts (Hello; engine/peers.py)

    def load(self, kv_bytes_per_token: int) -> EngineLoad:
        """The engine as the scheduler sees it; on this runtime every engine is its own node."""
        free = (self.kv_capacity_tokens - self.kv_reserved_tokens) * kv_bytes_per_token
        return EngineLoad(self.engine, self.engine, self.num_seqs, self.num_tokens, max(0, free))


class Stream(enum.Enum):
    """The client's stream of one attempt, beside its `phase` (the path its engines report)."""

    OPEN = 1  # tokens may still reach the client
    FINISHED = 2  # its last token was sent, or both engines let it go
    CANCELLED = 3  # the client went away, or a migrated attempt carries the stream on (recovery.py)
    FAILED = 4  # ended with one ServiceUnavailable naming why (recovery.py)


STREAM_MOVES: dict[Stream, frozenset[Stream]] = {
    Stream.OPEN: frozenset({Stream.FINISHED, Stream.CANCELLED, Stream.FAILED}),
    Stream.CANCELLED: frozenset({Stream.FAILED}),  # an attempt cut off whose stream then fails
    Stream.FINISHED: frozenset(),
    Stream.FAILED: frozenset(),
}


def kv_reservation_tokens(prompt_tokens: int, max_tokens: int, choices: int, block_tokens: int) -> int:
    """The DE's HBM a request may fill, in whole blocks: the prompt and its first choice's tokens,
    and per other choice a copy of the prompt's partial block and its own tokens (the prompt's full
    blocks are shared: PagedKVCache.fork)."""
    blocks = -(-(prompt_tokens + max_tokens) // block_tokens)
    return (blocks + (choices - 1) * (-(-max_tokens // block_tokens) + 1)) * block_tokens


@dataclass(slots=True)
class ChoiceStream:
    """One choice's tokens to the client (tokens.py); choice 0 is the request's own (OpenAI's n)."""

    generated: int = 0  # this attempt's tokens of the choice streamed to the client
    early: dict = field(default_factory=dict)  # index -> (token, finished, reason, logprobs): ahead of `generated`
    emitted: list = field(default_factory=list)  # every token of the choice the client has had
    done: bool = False  # its last token has streamed


@dataclass(slots=True)
class RouterRequest:
    rid: int
    req: GenerationRequest
    queue: asyncio.Queue
    arrival_s: float
    total_tokens: int  # kv_reservation_tokens: the DE's tok_e and HBM reservation
    qview: QueuedRequest  # the scheduler's view of it
    pe: EngineState | None = None
    de: EngineState | None = None
    digests: list = field(default_factory=list)  # the prompt's chained block digests (at admission)
    hit_tokens: int = 0
    read_charged_tokens: int = 0  # tokens booked on the read side's queue, until ReadDone
    side: ReadSide = ReadSide.PREFILL
    # a split read (`dualpath+split`, core/policy/split.py; `side` DECODE): the hit's prefix
    # [0, pe_part_tokens) the PE node reads, the rest the DE node reads; 0: the whole hit on `side`
    pe_part_tokens: int = 0
    pe_part_charged_tokens: int = 0  # tokens of the PE part booked on the PE's read queue, until its ReadDone
    de_regions: list = field(default_factory=list)
    pe_regions: list = field(default_factory=list)
    choices: list = field(default_factory=list)  # a ChoiceStream per choice (SamplingParams.n)
    # The furthest step of the request's path (core.phase) the router has seen, advanced with
    # check_transition. Two engines report it, and their messages may arrive in either order, so
    # `advance` walks forward and a step already passed is a no-op.
    phase: Phase = Phase.QUEUED
    stream: Stream = Stream.OPEN  # once not OPEN, the phase stops where it was (unless FINISHED)
    # What each engine has let go (its load, and on the DE the HBM, released): the PE at
    # PrefillDone, the DE at DecodeDone, either when it is lost. Not steps of `phase`: the two
    # engines let go in either order, independently of the path's last step the router has seen.
    pe_done: bool = False  # the PE has let the request go (PrefillDone): its load is released
    de_done: bool = False  # the DE has let it go (DecodeDone): its load and HBM are released
    final_first_token: FirstToken | None = None  # a 1-token answer, held until prompt_loaded
    persist_wait_since_s: float | None = None  # placement waits for a block still being written
    # Migration (recovery.py): attempt k > 0 of the client's request `origin` after an engine died;
    # its prompt is origin's + the `base_tokens` tokens streamed before it; `emitted` is every
    # token the client has had; `successor` is the attempt that replaced this one.
    origin: GenerationRequest | None = None  # the client's request (set to `req` for attempt 0)
    client_rid: int = 0  # the first attempt's id (metrics, seeds); 0: this is the first
    attempt: int = 0
    base_tokens: int = 0
    pe_side_only: bool = False  # a DE-path read whose DE died: the retry reads on the PE side
    local: bool = False  # prefilled on its DE (+selective, core/policy/local.py): no PE
    # a local request whose hit a PE node reads and relays to its DE (side PREFILL); `pe_done` is
    # then the relay's end (RelayDone); without a relay it holds from the start
    relay: EngineState | None = None
    recompute: bool = False  # the scheduler chose to compute its hit again (a slow store): a miss
    successor: "RouterRequest | None" = None

    def __post_init__(self) -> None:
        if self.origin is None:
            self.origin = self.req
        if not self.choices:
            self.choices = [ChoiceStream() for _ in range(self.req.params.n)]

    @property
    def generated(self) -> int:
        """Choice 0's tokens streamed in this attempt (migration continues n = 1 requests only)."""
        return self.choices[0].generated

    @property
    def early(self) -> dict:
        return self.choices[0].early

    @property
    def emitted(self) -> list:
        """Every token of choice 0 the client has had (the migrated attempt's prompt adds them)."""
        return self.choices[0].emitted

    @emitted.setter
    def emitted(self, tokens: list) -> None:
        self.choices[0].emitted = tokens

    def end(self, stream: Stream) -> None:
        """The stream moves on (STREAM_MOVES); ending it again the same way changes nothing."""
        if stream is not self.stream:
            if stream not in STREAM_MOVES[self.stream]:
                raise IllegalTransition(f"stream {self.stream.name} -> {stream.name} is not a legal move")
            self.stream = stream

    @property
    def finished(self) -> bool:
        """The stream has ended: its last token, the client gone, another attempt, or an error."""
        return self.stream is not Stream.OPEN

    @property
    def cancelled(self) -> bool:
        """Its later tokens are dropped and its phase stops where it was."""
        return self.stream in (Stream.CANCELLED, Stream.FAILED)

    @property
    def failed(self) -> bool:
        return self.stream is Stream.FAILED

    @property
    def stream_rid(self) -> int:
        """The client stream's id: the first attempt's."""
        return self.client_rid or self.rid

    @property
    def current(self) -> "RouterRequest":
        """The attempt that now carries the client's stream."""
        rr = self
        while rr.successor is not None:
            rr = rr.successor
        return rr

    def unassign(self) -> None:
        """Back to QUEUED before any engine heard of it (its engine died first): the one step
        backwards, legal because nothing was sent; the router has undone the bookings."""
        self.pe = self.de = self.relay = None
        self.local = self.pe_done = False
        self.phase, self.side, self.read_charged_tokens = Phase.QUEUED, ReadSide.PREFILL, 0
        self.pe_part_tokens = self.pe_part_charged_tokens = 0

    def advance(self, target: Phase) -> None:
        """Walk the path forward to `target`: READING only with a hit, DECODING only for more than
        one token (core.phase.LEGAL_TRANSITIONS)."""
        while not self.cancelled and self.phase < target:
            self.phase = check_transition(self.phase, self._next_phase())

    def _next_phase(self) -> Phase:
        if self.phase is Phase.PE_ASSIGNED:
            return Phase.READING if self.hit_tokens else Phase.PREFILL_READY
        if self.phase is Phase.KV_TO_DECODE:
            return Phase.FINISHED if self.req.params.max_tokens == 1 else Phase.DECODING
        return Phase(self.phase + 1)

    @property
    def placed(self) -> bool:
        """Both engines have their assignments (placement done)."""
        return self.phase > Phase.PE_ASSIGNED

    @property
    def prompt_loaded(self) -> bool:
        """The DE has the prompt's KV (and has announced its prompt blocks' persists)."""
        return self.phase >= Phase.DECODING

    @property
    def pe_side(self) -> EngineState | None:
        """Its PE, or a local request's relay (+selective): the engine on the PE side."""
        return self.pe if self.pe is not None else self.relay

    @property
    def side_engine(self) -> EngineState:
        """The engine whose node reads the hit."""
        engine = self.pe_side if self.side is ReadSide.PREFILL else self.de
        assert engine is not None
        return engine



class RouterView(ClusterView):
    """The live cluster as the scheduler asks about it (ClusterView)."""

    def __init__(self, engines: dict[int, EngineState], placement: Placement, kv_bytes_per_token: int,
                 store_latency_s: Callable[[int], float] = lambda node: 0.0) -> None:
        self._engines, self._placement = engines, placement
        self._kvb = kv_bytes_per_token
        self._latency_s = store_latency_s  # a node's store latency as its reader last reported

    def pe_loads(self, group: int) -> tuple[EngineLoad, ...]:
        return (self._engines[group].load(self._kvb),)

    de_loads = pe_loads

    def read_queue_tokens(self, node: int) -> int:
        return self._engines[node].read_queue_tokens

    def read_tokens(self, rr: RouterRequest) -> int:
        """The hit the pass counts now; placement books what it finds then (Router._try_place)."""
        return self._placement.lookup(rr.req.prompt_ids, rr.digests)

    def dram_tokens(self, rr: RouterRequest, node: int, hit_tokens: int) -> int:
        """What the router's copy of `node`'s DRAM tier holds of the hit (`+dram`, dram_index.py)."""
        dram = self._placement.dram
        return 0 if dram is None else dram.held_tokens(node, rr.digests, hit_tokens)

    def store_latency_s(self, node: int) -> float:
        return self._latency_s(node)


def check_ledgers(engines: dict[int, EngineState], requests: Iterable[RouterRequest]) -> None:
    """Every engine's loads, HBM reservation and read queue equal the sums over the live requests
    that hold them; no DE's reservations exceed its capacity (STYLE.md 8)."""
    tok = {e: 0 for e in engines}
    seq = dict(tok)
    kv = dict(tok)
    readq = dict(tok)
    for rr in requests:
        if (rr.phase > Phase.QUEUED) != (rr.pe is not None or rr.local) or (rr.placed and rr.de is None):
            raise AssertionError(f"request {rr.rid}: phase {rr.phase.name} but engines {rr.pe}, {rr.de}")
        if rr.read_charged_tokens:
            readq[rr.side_engine.engine] += rr.read_charged_tokens
        if rr.pe_part_charged_tokens:
            readq[rr.pe.engine] += rr.pe_part_charged_tokens
        if rr.pe is not None and not rr.pe_done:
            tok[rr.pe.engine] += rr.qview.num_tokens
            seq[rr.pe.engine] += 1
        if rr.de is not None and not rr.de_done:
            tok[rr.de.engine] += rr.total_tokens
            seq[rr.de.engine] += 1
            kv[rr.de.engine] += rr.total_tokens
    for e in engines.values():
        if (e.num_tokens, e.num_seqs) != (tok[e.engine], seq[e.engine]):
            raise AssertionError(f"engine {e.engine} load ledger off")
        if e.kv_reserved_tokens != kv[e.engine]:
            raise AssertionError(f"engine {e.engine} HBM ledger off")
        if e.role == EngineRole.DECODE and e.kv_reserved_tokens > e.kv_capacity_tokens:
            raise AssertionError(f"engine {e.engine} HBM overcommitted")
        if e.read_queue_tokens != readq[e.engine]:
            raise AssertionError(f"engine {e.engine} read queue ledger off")


def build_scheduler(cfg: RuntimeConfig, engines: list[EngineState], kv_bytes_per_token: int) -> tuple[GlobalScheduler, list[int], list[int]]:
    """(the scheduler over `engines` as groups of one, its PE ids, its DE ids): alpha from the
    configured SNIC rate, beta from the slowest PE's profiled rate (derive_thresholds), the mode's
    rules; each engine's present load (a rebuild after an engine was lost keeps what runs)."""
    pes = sorted(e.engine for e in engines if e.role == EngineRole.PREFILL)
    des = sorted(e.engine for e in engines if e.role == EngineRole.DECODE)
    by_id = {e.engine: e for e in engines}
    features = cfg.features
    snic = None if features.io_free else cfg.links.snic_bytes_per_s
    rate = min(by_id[e].prefill_tokens_per_s for e in pes)
    thresholds = derive_thresholds(cfg.scheduler.alpha_read_s, cfg.scheduler.beta_compute_s, snic, kv_bytes_per_token, rate)
    forced = None if cfg.force_read_side is None else ReadSide[cfg.force_read_side.name]  # ForcedSide -> ReadSide
    recompute = None
    if cfg.scheduler.recompute_when_faster:  # read or recompute (core/policy/recompute.py)
        recompute = RecomputeRule(kv_bytes_per_token, cfg.links.snic_bytes_per_s or float("inf"), rate)
    split = split_rule(cfg, kv_bytes_per_token) if features.split_reads else None
    local = cfg.scheduler.local_prefill_max_tokens if features.local_prefill else None
    rules = SchedulerRules(thresholds, features.dualpath_scheduler, features.de_read_path, cfg.scheduler.z_factor, forced,
                           recompute, split, features.tail_share, local, features.dram_tier)
    scheduler = GlobalScheduler(pes, des, rules)
    for g in pes:  # an idle engine is as the scheduler starts (a fresh cluster's first pass is unchanged)
        if by_id[g].num_tokens:
            scheduler.pe_released(g, by_id[g].num_tokens)
    for g in des:
        if by_id[g].num_tokens:
            scheduler.de_released(g, by_id[g].num_tokens)
    return scheduler, pes, des


def split_rule(cfg: RuntimeConfig, kv_bytes_per_token: int) -> SplitRule:
    """`dualpath+split` (core/policy/split.py) on this runtime: every node reads through a SNIC of the
    configured rate and streams a DE part over its one CNIC (links.cnic_rate). Unlimited links (no
    SNIC cap) have no rate to compare; equal nominal ones stand in, the CNIC CNIC_PER_SNIC x the SNIC
    as in the emulation (runtime/profile/emulation.py): the rule depends only on their ratios."""
    snic = cfg.links.snic_bytes_per_s or 1.0
    cnic = cfg.links.cnic_rate or CNIC_PER_SNIC * snic
    return SplitRule(cfg.block_tokens, kv_bytes_per_token, snic, snic, cnic, cfg.scheduler.split_min_blocks)
