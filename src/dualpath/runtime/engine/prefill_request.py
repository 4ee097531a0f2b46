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

    def move(self, stage: PrefillStage) -> None:
        self.stage = moved(PREFILL_MOVES, self.stage, stage)

    @property
    def computable(self) -> bool:
        """Ready for a forward: its cached KV in place, not yet computed, no PD copy in flight."""
        return self.stage is PrefillStage.READY and self.pending_pd == 0

    def restart(self) -> None:
        """Its loaded KV failed every check: forget the hit and everything computed, so the next
        forwards recompute the whole prompt (rewriting every byte of its DE region)."""
        self.cached = self.hit_tokens = 0
        self.hit_sent = False
        self.pd_sums = []

    @property
    def remaining(self) -> int:
        return len(self.prompt) - self.cached

    @property
    def pe_path(self) -> bool:
        return self.assign.read_side == ReadSide.PREFILL
