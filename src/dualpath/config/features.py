"""The modes: which of DualPath's mechanisms run (docs/paper.md §6.5's ablations), for both worlds."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import InputError


@dataclass(frozen=True, slots=True)
class Features:
    """Ablation switches (docs/paper.md §6.5). `basic` has none; `dualpath` all; `oracle` adds io_free.
    `dualpath+split` adds split_reads, beyond the paper: a hit read on both sides at once
    (core/policy/split.py; both worlds). `+tail` after any mode adds tail_share, beyond the paper:
    a burst of requests spread over the open PE groups (core/policy/tail.py; both worlds)."""

    layerwise_prefill: bool
    de_read_path: bool
    dualpath_scheduler: bool
    io_free: bool = False
    split_reads: bool = False
    tail_share: bool = False


_FEATURE_WORDS = {"layerwise": "layerwise_prefill", "de_read": "de_read_path", "scheduler": "dualpath_scheduler"}
MODE_PRESETS = {
    "basic": Features(False, False, False),
    "dualpath": Features(True, True, True),
    "oracle": Features(True, True, True, io_free=True),
    "dualpath+split": Features(True, True, True, split_reads=True),
}


TAIL_SUFFIX = "+tail"


def parse_mode(text: str) -> Features:
    """`basic`, `dualpath`, `oracle`, `dualpath+split`, or `basic+W[+W...]` with W in layerwise,
    de_read, scheduler; any of them followed by `+tail`."""
    name = text.strip().lower()
    if name.endswith(TAIL_SUFFIX) and name != TAIL_SUFFIX:
        return replace(parse_mode(name.removesuffix(TAIL_SUFFIX)), tail_share=True)
    if name in MODE_PRESETS:
        return MODE_PRESETS[name]
    parts = name.split("+")
    if parts[0] != "basic" or len(parts) < 2 or any(p not in _FEATURE_WORDS for p in parts[1:]):
        raise InputError(
            f"unknown mode {text!r}: use basic, dualpath, oracle, dualpath+split, or basic+{'/'.join(_FEATURE_WORDS)} combined with '+'; "
            f"any of them +tail"
        )
    return replace(MODE_PRESETS["basic"], **{_FEATURE_WORDS[p]: True for p in parts[1:]})
