"""The modes: which of DualPath's mechanisms run (docs/paper.md §6.5's ablations), for both worlds."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError


@dataclass(frozen=True, slots=True)
class Features:
    """Ablation switches (docs/paper.md §6.5). `basic` has none; `dualpath` all; `oracle` adds io_free.
    `dualpath+split` adds split_reads, beyond the paper: a hit read on both sides at once
    (core/policy/split.py; both worlds). `+tail` after any mode adds tail_share, beyond the paper:
    a burst of requests spread over the open PE groups (core/policy/tail.py; both worlds).
    `+selective` after any mode (`selective` alone: basic's) adds local_prefill, beyond the paper:
    a request with few uncached tokens prefilled on its DE, no PE (core/policy/local.py; both
    worlds). `+dram` after any mode adds dram_tier, beyond the paper: per node an LRU of Full Blocks
    in host DRAM in front of storage, its size ClusterConfig.dram_tier_gb_per_node (simulator) or
    RuntimeConfig.store.dram_tier_mb (runtime) (core/dram.py; both worlds)."""

    layerwise_prefill: bool
    de_read_path: bool
    dualpath_scheduler: bool
    io_free: bool = False
    split_reads: bool = False
    tail_share: bool = False
    local_prefill: bool = False
    dram_tier: bool = False


_FEATURE_WORDS = {"layerwise": "layerwise_prefill", "de_read": "de_read_path", "scheduler": "dualpath_scheduler"}
MODE_PRESETS = {
    "basic": Features(False, False, False),
    "dualpath": Features(True, True, True),
    "oracle": Features(True, True, True, io_free=True),
    "dualpath+split": Features(True, True, True, split_reads=True),
}


TAIL_SUFFIX = "+tail"
SELECTIVE_SUFFIX = "+selective"
DRAM_SUFFIX = "+dram"
SELECTIVE = "selective"  # basic with decode-local prefill for short appends (llm-d's rule)
_SUFFIXES = {TAIL_SUFFIX: "tail_share", SELECTIVE_SUFFIX: "local_prefill", DRAM_SUFFIX: "dram_tier"}


def parse_mode(text: str) -> Features:
    """`basic`, `dualpath`, `oracle`, `dualpath+split`, `selective`, or `basic+W[+W...]` with W in
    layerwise, de_read, scheduler; any of them followed by `+tail`, `+selective`, `+dram` (any of
    these, in any order)."""
    name = text.strip().lower()
    for suffix, switch in _SUFFIXES.items():
        if name.endswith(suffix) and name != suffix:
            return replace(parse_mode(name.removesuffix(suffix)), **{switch: True})
    if name == SELECTIVE:
        return replace(MODE_PRESETS["basic"], local_prefill=True)
    if name in MODE_PRESETS:
        return MODE_PRESETS[name]
    parts = name.split("+")
    if parts[0] != "basic" or len(parts) < 2 or any(p not in _FEATURE_WORDS for p in parts[1:]):
        raise InputError(
            f"unknown mode {text!r}: use basic, dualpath, oracle, dualpath+split, selective, or basic+{'/'.join(_FEATURE_WORDS)} "
            f"combined with '+'; any of them +tail, +selective, +dram"
        )
    return replace(MODE_PRESETS["basic"], **{_FEATURE_WORDS[p]: True for p in parts[1:]})
