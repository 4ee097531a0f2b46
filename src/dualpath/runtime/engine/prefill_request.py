"""A prefill engine's record of one request (shared by the engine loop and its KV stream)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.snapshot import ReadSide
from ..protocol import PrefillAssign
from .stages import PREFILL_MOVES, PrefillStage, moved


@dataclass(slots=True)
class PrefillRequest:
    assign: PrefillAssign
    hit_tokens: int
    cached: int = 0
    stage: PrefillStage = PrefillStage.LOADING  # stages.py
    hit_sent: bool = False
    pending_pd: int = 0
    first_token: int | None = None  # sampled when the last chunk is computed
    first_logprobs: list = field(default_factory=list)  # its logprobs on the wire, when asked for
    more_first: list = field(default_factory=list)  # choices 1..n-1's [first token, logprobs] (protocol.py)
    cancelled: bool = False  # beside the stage: ends it when nothing in flight touches it
    prompt: list = field(default_factory=list)
    pd_sums: list = field(default_factory=list)  # checksums of every PD piece sent (transport/integrity.py)
    # The hit's prefix [0, own_hit_tokens) this node reads into its own buffer: the whole hit on the
    # PE path, a split read's PE part (`dualpath+split`), 0 on the DE path; the rest of the hit the DE
    # reads into its region. Its loads come from here, the rest's by `LayerPull` (kv_stream.py).
    own_hit_tokens: int = 0
    own_read_pending: bool = False  # this node's read of its part is not in yet (ReadFinished)
    peer_read_pending: bool = False  # the DE's read of its part is not in yet (HitReady)
    own_ok_tokens: int = 0  # of its own part, the tokens read and verified so far
    peer_ok_tokens: int = 0  # of the DE's part (tokens [own_hit_tokens, hit_tokens))

    @classmethod
    def assigned(cls, a: PrefillAssign) -> "PrefillRequest":
        """A new request's record, waiting for its reads: this node's part, the DE's part, or both."""
        own = a.hit_tokens if a.read_side == ReadSide.PREFILL else a.pe_part_tokens
        r = cls(a, a.hit_tokens, cached=a.hit_tokens, prompt=list(a.prompt_ids), own_hit_tokens=own,
                own_ok_tokens=own, peer_ok_tokens=a.hit_tokens - own)
        r.own_read_pending = own > 0
        r.peer_read_pending = a.read_side == ReadSide.DECODE and a.hit_tokens > 0
        return r

    def part_loaded(self, own: bool, ok_blocks: int, block_tokens: int) -> bool:
        """One part of the hit is in, its first `ok_blocks` blocks verified (a block that fails its
        checksum ends the part there); True once every part is. The hit is then what the parts give
        in a row from token 0: a short own part ends it (the DE's part would follow a gap)."""
        if own:
            self.own_read_pending = False
            self.own_ok_tokens = min(self.own_hit_tokens, ok_blocks * block_tokens)
        else:
            self.peer_read_pending = False
            self.peer_ok_tokens = min(self.hit_tokens - self.own_hit_tokens, ok_blocks * block_tokens)
        if self.own_read_pending or self.peer_read_pending:
            return False
        whole = self.own_ok_tokens == self.own_hit_tokens
        self.hit_tokens = self.cached = self.own_ok_tokens + (self.peer_ok_tokens if whole else 0)
        self.own_hit_tokens = self.own_ok_tokens  # the rest of the hit is recomputed
        return True

    def move(self, stage: PrefillStage) -> None:
        self.stage = moved(PREFILL_MOVES, self.stage, stage)

    @property
    def computable(self) -> bool:
        """Ready for a forward: its cached KV in place, not yet computed, no PD copy in flight."""
        return self.stage is PrefillStage.READY and self.pending_pd == 0

    def restart(self) -> None:
        """Its loaded KV failed every check: forget the hit and everything computed, so the next
        forwards recompute the whole prompt (rewriting every byte of its DE region)."""
        self.cached = self.hit_tokens = self.own_hit_tokens = 0
        self.hit_sent = False
        self.pd_sums = []

    @property
    def remaining(self) -> int:
        return len(self.prompt) - self.cached

    @property
    def pe_path(self) -> bool:
        return self.assign.read_side == ReadSide.PREFILL

    @property
    def own_tokens(self) -> int:
        """Tokens [0, own_tokens) of its cached KV that sit in this node's buffer, the rest in its DE's
        region: the PE path's buffer holds every chunk (written back), a split read's only its PE part."""
        return self.cached if self.pe_path else min(self.own_hit_tokens, self.cached)
