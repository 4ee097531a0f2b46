"""Summaries: distributions (mean, p50, p90, p99), turn latencies and SNIC balance."""

from __future__ import annotations

import math
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


def certainly_above(num_above: int, total: int, q: float) -> bool:
    """Whether the q-th percentile (as `distribution` computes it: numpy's linear interpolation) of
    `total` values must exceed a threshold that `num_above` of them, known so far, exceed, whatever
    the others turn out to be. Sorted ascending, the percentile lies at or above the value of rank
    floor(q / 100 * (total - 1)), and that value exceeds the threshold once the values above it
    number at least total - that rank (`dualpath plan` stops a run that must miss its TTFT SLO)."""
    if total <= 0 or num_above <= 0:
        return False
    return num_above >= total - math.floor(q / 100 * (total - 1))


def turn_latencies(arrival_s: Sequence[float] | np.ndarray, first_s: Sequence[float] | np.ndarray,
                   second_s: Sequence[float] | np.ndarray, finish_s: Sequence[float] | np.ndarray,
                   gen_tokens: Sequence[int] | np.ndarray) -> dict[str, dict[str, float]]:
    """The one definition of a turn's latencies, for both worlds (docs/paper.md §6.3): TTFT = first
    token - arrival; TTST = second token - first token (turns with >= 2 tokens); TPOT = the mean
    gap after the second token, (finish - second) / (tokens - 2) (turns with >= 3 tokens)."""
    arrival, first = np.asarray(arrival_s, dtype=float), np.asarray(first_s, dtype=float)
    second, finish = np.asarray(second_s, dtype=float), np.asarray(finish_s, dtype=float)
    gen = np.asarray(gen_tokens, dtype=int)
    two, three = gen >= 2, gen >= 3
    return {
        "ttft_s": distribution(first - arrival).to_dict(),
        "ttst_s": distribution(second[two] - first[two]).to_dict(),
        "tpot_s": distribution((finish[three] - second[three]) / (gen[three] - 2)).to_dict(),
    }


def snic_balance(window_bytes: np.ndarray, capacity_bytes_per_window: float, min_utilisation: float) -> float:
    """Mean over windows of Max/Avg across SNICs of the bytes read in the window (docs/paper.md §6.6:
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
