"""Summaries: distributions (mean, p50, p90, p99) and SNIC balance."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True, slots=True)
class Distribution:
    mean: float
    p50: float
    p90: float
    p99: float
    count: int

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def distribution(values: Sequence[float] | np.ndarray) -> Distribution:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        nan = float("nan")
        return Distribution(nan, nan, nan, nan, 0)
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return Distribution(float(a.mean()), float(p50), float(p90), float(p99), int(a.size))


def snic_balance(window_bytes: np.ndarray, capacity_bytes_per_window: float, min_utilisation: float) -> float:
    """Mean over windows of Max/Avg across SNICs of the bytes read in the window (PAPER.md 6.6:
    1.0 = perfect). `window_bytes` is [num_windows, num_snics]. Windows whose mean utilisation is
    below `min_utilisation` are skipped (the ratio means nothing on an idle system). NaN if none."""
    if window_bytes.size == 0:
        return float("nan")
    avg = window_bytes.mean(axis=1)
    keep = avg >= min_utilisation * capacity_bytes_per_window
    if not keep.any():
        return float("nan")
    ratios = window_bytes[keep].max(axis=1) / avg[keep]
    return float(ratios.mean())
