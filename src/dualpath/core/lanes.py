"""Traffic lanes on the compute NIC (docs/paper.md §2.3).

Model collectives ride a high-priority lane; every KV byte (layer streams, PD transfer,
host<->device copies) rides a low-priority lane. The arbiter is weighted round robin; the
paper reserves "approximately 99%" for the high-priority virtual lane under contention, so the
default weights are 99:1. An idle lane's share goes to the busy ones (work conserving).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Lane(enum.IntEnum):
    LATENCY_CRITICAL = 0  # model traffic: EP all-to-all, TP/CP collectives
    KV = 1  # bulk KV: layer blocks, PD transfer, H2D/D2H, storage reads and writes


@dataclass(frozen=True, slots=True)
class LaneWeights:
    """Weighted-round-robin weights; docs/paper.md §2.3: ~99% for the high-priority VL."""

    latency_critical: float = 99.0
    kv: float = 1.0
    # ablation (`dualpath bench lanes`): one FIFO class for both lanes, no arbitration: every flow of a link
    # gets an equal share (simulator) / one tc class (testbed)
    one_class: bool = False

    def __post_init__(self) -> None:
        if self.latency_critical <= 0 or self.kv <= 0:
            raise ValueError("lane weights must be positive (a zero weight starves a lane)")

    def weight(self, lane: Lane) -> float:
        return self.latency_critical if lane is Lane.LATENCY_CRITICAL else self.kv

    def shares(self, busy: "set[Lane] | frozenset[Lane]") -> dict[Lane, float]:
        """Fraction of link capacity each busy lane gets; idle lanes get nothing."""
        total = sum(self.weight(l) for l in busy)
        return {l: self.weight(l) / total for l in busy}
