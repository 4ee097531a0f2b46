"""Intra-engine batching for a PE forward (docs/paper.md §3.5).

Requests join the batch in FIFO order while every budget holds. For the first request that
would break a budget, the largest chunk 1 <= c < remaining that still fits is found by binary
search and prefilled as a chunk (chunked prefill); the batch then closes.

DualPath's budget is the compute quota: predicted attention time <= 300 ms, where each entry
(cached, bsz) costs its attention FLOPs converted to time by a profiled curve. The basic engine
uses token and HBM budgets instead. Every cost must be additive over entries and non-decreasing
in the chunk size.

Progress rule: if even one token of the head request breaks a budget on an empty batch, the
batch takes that single token anyway, so a request bigger than the quota still advances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from ..snapshot import BatchCandidate, BatchEntry

CostFn = Callable[[int, int], float]  # (cached_tokens, compute_tokens) -> cost


@dataclass(frozen=True, slots=True)
class Budget:
    name: str
    cost: CostFn
    limit: float


def _compute_tokens(cached: int, bsz: int) -> float:
    return bsz


def prefill_budgets(dualpath_scheduler: bool, quota_cost: CostFn, quota_limit: float, tokens_per_forward: int,
                    memory: Budget | None) -> list[Budget]:
    """The one budget rule of a PE forward, for both worlds (docs/paper.md §3.5). DualPath: the compute
    quota, `quota_cost` (predicted attention of an entry, in the unit of `quota_limit`) summed
    within `quota_limit`. Without the DualPath scheduler: `tokens_per_forward` computed tokens.
    Then the engine's memory for the batch's cached KV, when it has a limit (`memory`)."""
    if dualpath_scheduler:
        budgets = [Budget("compute_quota", quota_cost, quota_limit)]
    else:
        budgets = [Budget("tokens", _compute_tokens, tokens_per_forward)]
    if memory is not None:
        budgets.append(memory)
    return budgets


def _fits(budgets: Sequence[Budget], used: list[float], cached: int, bsz: int) -> bool:
    for b, u in zip(budgets, used):  # a plain loop: this is the batcher's innermost call
        if u + b.cost(cached, bsz) > b.limit:
            return False
    return True


def _largest_chunk(budgets: Sequence[Budget], used: list[float], cand: BatchCandidate) -> int:
    """Largest c in [1, remaining) that fits, or 0 if none does."""
    lo, hi = 0, cand.remaining_tokens - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _fits(budgets, used, cand.cached_tokens, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def form_prefill_batch(
    candidates: Iterable[BatchCandidate],
    budgets: Sequence[Budget],
    allow_chunking: bool = True,
) -> tuple[BatchEntry, ...]:
    used = [0.0] * len(budgets)
    out: list[BatchEntry] = []
    for cand in candidates:
        if cand.remaining_tokens <= 0:
            raise ValueError(f"candidate with nothing to compute: {cand}")
        take = cand.remaining_tokens
        if not _fits(budgets, used, cand.cached_tokens, take):
            take = _largest_chunk(budgets, used, cand) if allow_chunking else 0
            if take == 0 and not out:
                take = 1 if allow_chunking else cand.remaining_tokens
            if take == 0:
                break
            out.append(BatchEntry(cand.rid, cand.cached_tokens, take))
            break
        for i, b in enumerate(budgets):
            used[i] += b.cost(cand.cached_tokens, take)
        out.append(BatchEntry(cand.rid, cand.cached_tokens, take))
    return tuple(out)
