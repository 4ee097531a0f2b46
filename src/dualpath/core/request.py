"""Turns and requests.

A trajectory (one agent) is a list of rounds (append_tokens, gen_tokens). Round i sends the
whole context (all earlier appends and generations) plus its own append, and generates exactly
gen_tokens tokens (docs/paper.md §4.2, the paper's A.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, final

from .record import Record


@final
class RequestId(Record):
    """An agent's turn (a `Record`: one is built per turn on the simulator's hot path)."""

    __slots__ = ("agent", "turn")

    def __init__(self, agent: int, turn: int) -> None:
        self.agent: Final = agent
        self.turn: Final = turn

    def _key(self) -> tuple[int, int]:
        return (self.agent, self.turn)

    def __str__(self) -> str:
        return f"a{self.agent}t{self.turn}"


@dataclass(frozen=True, slots=True)
class TurnSpec:
    """One round of a trajectory: `append_tokens` new prompt tokens, then `gen_tokens` generated.
    `wait_s`: the agent's tool (or think) time before it sends this round, counted from the end of
    its previous round; 0 replays rounds back to back, as the paper does (docs/paper.md §4.2). A
    first round's wait is its agent's arrival, so it is always 0 (workloads/tool_time.py)."""

    append_tokens: int
    gen_tokens: int
    wait_s: float = 0.0

    def __post_init__(self) -> None:
        if self.append_tokens < 0 or self.gen_tokens < 1:
            raise ValueError(f"need append_tokens >= 0 and gen_tokens >= 1, got {self}")
        if not 0.0 <= self.wait_s < float("inf"):  # also refuses NaN
            raise ValueError(f"need a finite wait_s >= 0, got {self}")


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What a turn asks for: `input_tokens` = context + append; generate `gen_tokens`.

    `hit_tokens` is the stored prefix (a multiple of the block size, <= input_tokens - 1 so at
    least one token is computed and the first output token has logits); `miss_tokens` are computed.
    """

    rid: RequestId
    input_tokens: int
    gen_tokens: int
    hit_tokens: int

    def __post_init__(self) -> None:
        if not 0 <= self.hit_tokens < self.input_tokens:
            raise ValueError(f"need 0 <= hit_tokens < input_tokens: {self}")
        if self.gen_tokens < 1:
            raise ValueError(f"gen_tokens must be >= 1: {self}")

    @property
    def miss_tokens(self) -> int:
        return self.input_tokens - self.hit_tokens

    @property
    def total_tokens(self) -> int:
        """Tokens the request occupies at the end of its decode (input + generated)."""
        return self.input_tokens + self.gen_tokens


def usable_hit_tokens(stored_prefix_tokens: int, input_tokens: int, block_tokens: int) -> int:
    """Largest block-aligned hit that leaves at least one prompt token to compute."""
    limit = input_tokens - 1  # min(stored, input - 1) and max(0, ...) written out: a per-turn hot path
    if not limit < stored_prefix_tokens:
        limit = stored_prefix_tokens
    usable = limit // block_tokens * block_tokens
    return usable if usable > 0 else 0
