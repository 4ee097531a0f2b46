"""One agent's trajectory: the rounds it replays (docs/paper.md §4.2, the paper's A.3).

Round i sends Context_i + A_i, where Context_i = A_0, G_0, ..., A_{i-1}, G_{i-1} (all earlier
appends and generations), and generates exactly g_i tokens. Lengths only: token ids are never
stored, so two agents never share a block (the extra-agent rule in `generator` relies on this).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError


@dataclass(frozen=True, slots=True)
class Trajectory:
    """Rounds of one agent. `arrival_s` is the trace's own arrival time, when it has one.

    `arrival_s` is None when the trace does not fix it; the experiment's arrival process
    (`arrivals.offline_arrivals` or `arrivals.poisson_arrivals`) then decides.
    """

    agent: int
    turns: tuple[TurnSpec, ...]
    arrival_s: float | None = None
    # _end_tokens[i] = sequence length after turn i's generation (input + gen of turn i).
    # Precomputed so per-turn lengths are O(1); excluded from equality because it is derived.
    _end_tokens: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.agent < 0:
            raise ValueError(f"agent must be >= 0, got {self.agent}")
        if not self.turns:
            raise ValueError(f"agent {self.agent}: a trajectory needs at least one turn")
        if self.arrival_s is not None and not self.arrival_s >= 0.0:
            raise ValueError(f"agent {self.agent}: arrival_s must be >= 0, got {self.arrival_s}")
        ends = tuple(itertools.accumulate(t.append_tokens + t.gen_tokens for t in self.turns))
        object.__setattr__(self, "_end_tokens", ends)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    def context_tokens(self, i: int) -> int:
        """Tokens before turn i's append: all earlier appends and generations."""
        self._check_turn(i)
        return self._end_tokens[i - 1] if i > 0 else 0

    def input_tokens(self, i: int) -> int:
        """Prompt of turn i (context + append): what the client sends."""
        self._check_turn(i)
        return self._end_tokens[i] - self.turns[i].gen_tokens

    def end_tokens(self, i: int) -> int:
        """Sequence length once turn i has generated (input + gen of turn i)."""
        self._check_turn(i)
        return self._end_tokens[i]

    @property
    def total_tokens(self) -> int:
        """Final length: all appends and all generations."""
        return self._end_tokens[-1]

    def truncate(self, max_len_tokens: int) -> Trajectory:
        """Longest prefix of turns whose final length is <= max_len_tokens.

        Lengths only grow (gen_tokens >= 1), so the kept turns are exactly those with
        end_tokens(i) <= max_len_tokens.
        """
        num_kept = bisect.bisect_right(self._end_tokens, max_len_tokens)
        if num_kept == 0:
            raise InputError(
                f"MaxLen {max_len_tokens} is smaller than the first round "
                f"({self._end_tokens[0]} tokens) of agent {self.agent}"
            )
        if num_kept == len(self.turns):
            return self
        return Trajectory(self.agent, self.turns[:num_kept], self.arrival_s)

    def _check_turn(self, i: int) -> None:
        if not 0 <= i < len(self.turns):
            raise IndexError(f"turn {i} outside [0, {len(self.turns)}) of agent {self.agent}")
