"""The scheduling pass's constants (core/scheduler.py), one section for both worlds."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..core.lanes import LaneWeights
from ..core.policy.local import LOCAL_PREFILL_MAX_TOKENS_DEFAULT
from ..core.policy.split import MIN_SPLIT_BLOCKS
from ..errors import InputError


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    alpha_read_s: float = 3.0  # docs/paper.md §3.2, §5: short-read-queue threshold, seconds of reads
    beta_compute_s: float = 5.0  # docs/paper.md §3.2, §5: unfinished-token cap, seconds of GPU processing
    z_factor: float = 1.05  # docs/paper.md §3.3
    compute_quota_s: float = 0.300  # docs/paper.md §3.5: predicted attention time per PE forward
    # Basic engine batching: 16K tokens per GPU per prefill batch, DeepSeek's profiled prefill
    # setting (docs/hardware.md §7.1, [S-PROF]).
    basic_tokens_per_forward: int = 16384
    lane_weights: LaneWeights = field(default_factory=LaneWeights)
    # choice: read or recompute (core/policy/recompute.py): a hit whose read the store
    # would deliver later than a PE computes it again is recomputed. Off by default (the paper
    # always reads); for a degraded store.
    recompute_when_faster: bool = False
    # choice: `dualpath+split` (core/policy/split.py): a hit under this many blocks is read on one
    # side; the reason for the default is MIN_SPLIT_BLOCKS's
    split_min_blocks: int = MIN_SPLIT_BLOCKS
    # choice: `+selective` (core/policy/local.py): a request with at most this many uncached
    # tokens is prefilled on its DE; the default is LOCAL_PREFILL_MAX_TOKENS_DEFAULT's
    local_prefill_max_tokens: int = LOCAL_PREFILL_MAX_TOKENS_DEFAULT

    def __post_init__(self) -> None:
        if min(self.alpha_read_s, self.beta_compute_s, self.z_factor, self.compute_quota_s) <= 0:
            raise InputError("scheduler thresholds must be positive")
        if self.split_min_blocks < 2:
            raise InputError("split_min_blocks must be at least 2 (a split has two parts)")
        if self.local_prefill_max_tokens < 1:
            raise InputError("local_prefill_max_tokens must be at least 1")
        if self.basic_tokens_per_forward <= 0:
            raise InputError("basic_tokens_per_forward must be positive")
