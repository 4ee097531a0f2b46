"""Scheduling policy (docs/paper.md §3), pure: frozen snapshots in, frozen decisions out."""

from .batching import Budget, form_prefill_batch, prefill_budgets
from .decode import distribute_to_groups, select_decode
from .local import prefill_locally
from .prefill import PrefillThresholds, select_prefill
from .read_side import choose_read_side, side_cost_tokens
from .recompute import RecomputeRule, should_recompute
from .round_robin import RoundRobinCursor, round_robin_decode, round_robin_prefill, round_robin_read_side
from .split import SplitRule, split_read

__all__ = [
    "Budget",
    "PrefillThresholds",
    "RecomputeRule",
    "RoundRobinCursor",
    "SplitRule",
    "choose_read_side",
    "distribute_to_groups",
    "form_prefill_batch",
    "prefill_budgets",
    "prefill_locally",
    "round_robin_decode",
    "round_robin_prefill",
    "round_robin_read_side",
    "select_decode",
    "select_prefill",
    "should_recompute",
    "side_cost_tokens",
    "split_read",
]
