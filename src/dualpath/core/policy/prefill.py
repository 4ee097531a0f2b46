"""PE selection: Algorithm 1 of the paper (docs/paper.md §3.2).

Runs when a PE group's leader fetches. Requests leave the global queue strictly FIFO. Engines
fall in three categories by their node's disk-read queue and their own unfinished tokens:

  overloaded: tok_e > beta                      -> gets nothing
  C2 (short read queue): read_q <= alpha, tok_e <= beta -> preferred (its SNIC would idle)
  C3 (long read queue):  read_q >  alpha, tok_e <= beta

The head request goes to the C2 engine with the least tok_e, else the C3 engine with the least
tok_e, else the fetch ends. tok_e grows by len(r) after each assignment, so an engine can move
into the overloaded category within one fetch. Ties go to the lower engine id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ..snapshot import Assignment, EngineLoad, QueuedRequest


@dataclass(frozen=True, slots=True)
class PrefillThresholds:
    """alpha: tokens a node can read from storage in 3 s; beta: tokens one GPU can process in
    5 s (docs/paper.md §3.2 and §5: alpha = 3 s of reads, beta = 5 s of GPU processing). Both are
    profiled by the caller and given here in tokens."""

    alpha_tokens: int
    beta_tokens: int

    def __post_init__(self) -> None:
        if self.alpha_tokens < 0 or self.beta_tokens <= 0:
            raise ValueError(f"need alpha_tokens >= 0 and beta_tokens > 0: {self}")


def select_prefill(
    group: Sequence[EngineLoad],
    read_queue_tokens: Mapping[int, int],
    queue: Iterable[QueuedRequest],
    thresholds: PrefillThresholds,
) -> tuple[Assignment, ...]:
    """Assign a FIFO prefix of `queue` to engines of `group`; see the module docstring."""
    tok: dict[int, int] = {}
    short: dict[int, bool] = {}
    alpha = thresholds.alpha_tokens
    for e in group:
        tok[e.engine] = e.num_tokens
        short[e.engine] = read_queue_tokens[e.node] <= alpha
    beta = thresholds.beta_tokens
    out: list[Assignment] = []
    for req in queue:
        # the least (tok_e, id) among the open C2 engines, else among the open ones (one pass)
        c2: int | None = None
        other: int | None = None
        c2_tok = other_tok = 0
        for eid, t in tok.items():
            if t > beta:
                continue
            if short[eid]:
                if c2 is None or t < c2_tok or (t == c2_tok and eid < c2):
                    c2, c2_tok = eid, t
            elif other is None or t < other_tok or (t == other_tok and eid < other):
                other, other_tok = eid, t
        if c2 is not None:
            pe = c2
        elif other is not None:
            pe = other
        else:
            break
        tok[pe] += req.num_tokens
        out.append(Assignment(req.rid, pe))
    return tuple(out)
