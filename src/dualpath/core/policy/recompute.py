"""Read or recompute, for a degraded store: a hit whose read would take longer than computing its tokens
again is recomputed instead. Pure: the world supplies its read rate and its store's latency.

The rule, per request, once its read side is chosen:

    read_s      = store latency of the side's node + hit tokens * KV bytes per token / read rate
    recompute_s = hit tokens / the PE's prompt tokens per second (the rate beta is measured in)
    recompute   iff recompute_s < read_s

The queue of reads ahead is not counted. Queued reads at full bandwidth are the regime DualPath
balances across its two paths (docs/paper.md §3.4); counting them would turn that design point into
recomputation and spend the PE compute the cache saves. What the rule catches is a store that
answers late: a latency that is large next to the request's own transfer (a stalled or degraded
store, injected in tests). The per-token recompute cost is first order: prompt tokens per second
at the probe point, attention's growth with context ignored, which makes recomputation look
cheaper for long contexts than it is, so the rule leans towards recompute only when the store is
far behind.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RecomputeRule:
    kv_bytes_per_token: int
    read_bytes_per_s: float  # a node's read rate: min(SNIC, storage read), per direction
    recompute_tokens_per_s: float  # a PE's prompt tokens per second (costmodel/cost.py or the probe)

    def __post_init__(self) -> None:
        if self.kv_bytes_per_token <= 0 or self.read_bytes_per_s <= 0 or self.recompute_tokens_per_s <= 0:
            raise ValueError("read-or-recompute needs positive KV bytes per token, read rate and compute rate")


def read_s(rule: RecomputeRule, hit_tokens: int, store_latency_s: float) -> float:
    return store_latency_s + hit_tokens * rule.kv_bytes_per_token / rule.read_bytes_per_s


def recompute_s(rule: RecomputeRule, hit_tokens: int) -> float:
    return hit_tokens / rule.recompute_tokens_per_s


def should_recompute(rule: RecomputeRule, hit_tokens: int, store_latency_s: float) -> bool:
    """True when computing the hit again is faster than reading it (0 tokens: nothing to decide)."""
    if hit_tokens < 0 or store_latency_s < 0:
        raise ValueError("hit tokens and store latency are non-negative")
    return hit_tokens > 0 and recompute_s(rule, hit_tokens) < read_s(rule, hit_tokens, store_latency_s)
