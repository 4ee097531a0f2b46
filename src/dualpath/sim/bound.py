"""Stopping a run that cannot come first (`dualpath plan`'s branch and bound).

A planner ranks configurations by JCT, those that meet the SLOs first (plan/search.py). Once one
configuration has been simulated, another can rank above it only with a shorter JCT, or by meeting
a TTFT SLO that the first misses. So a run given a `RunBound` stops as soon as
  - its clock, from its first arrival, is past `jct_s` with agents still running: its JCT will be
    longer; and, when `ttft_p99_s` is set (the bound's owner misses the SLOs, so a run that meets
    them would still rank first),
  - its TTFT p99 is certain to exceed `ttft_p99_s` whatever its turns still to come give: enough
    of its finished turns already took longer (metrics/summary.py `certainly_above`).
The check runs between twentieths of the loop's chunks of events (simulator.py `_run_watched`),
which run the same events in the same order, so it never changes what a run that does not stop
computes: a run that finishes returns the same result as without a bound. A stopped run returns
`stopped_result` instead, whose numbers are lower bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from .._build import build_kind
from ..metrics import TurnRecorder
from ..metrics.summary import certainly_above


@dataclass(frozen=True, slots=True)
class RunBound:
    jct_s: float  # stop once the clock (from the first arrival) is past it with agents still running
    ttft_p99_s: float | None = None  # and, if set, only once the TTFT p99 must exceed it

    def __post_init__(self) -> None:
        if not self.jct_s > 0 or not math.isfinite(self.jct_s):
            raise ValueError(f"a run bound needs a positive JCT, got {self.jct_s}")
        if self.ttft_p99_s is not None and not self.ttft_p99_s > 0:
            raise ValueError(f"a run bound's TTFT p99 must be positive, got {self.ttft_p99_s}")

    def describe(self) -> str:
        ttft = "" if self.ttft_p99_s is None else f" missing TTFT p99 {self.ttft_p99_s:g} s"
        return f"stops past JCT {self.jct_s:.6g} s{ttft}"


class BoundWatch:
    """One run's check of its bound: counts the finished turns over the TTFT limit as they come
    (the recorder only grows), so each check costs the turns finished since the last."""

    def __init__(self, bound: RunBound, recorder: TurnRecorder, agents: Sequence[Any]) -> None:
        self.bound = bound
        self._recorder = recorder
        self._start_s = min((a.arrival_s for a in agents), default=0.0)
        self._num_turns = sum(len(a.turns) for a in agents)  # an offline run records every turn
        self._counted = 0
        self._num_over = 0

    def passed(self, now_s: float) -> bool:
        """Whether the run can stop now (its agents not all done: the caller's condition)."""
        bound = self.bound
        if not now_s - self._start_s > bound.jct_s:
            return False
        limit = bound.ttft_p99_s
        if limit is None:
            return True
        rec = self._recorder
        first, arrival = rec.first_s, rec.arrival_s
        over = self._num_over
        for i in range(self._counted, len(first)):
            if first[i] - arrival[i] > limit:
                over += 1
        self._counted = len(first)
        self._num_over = over
        return certainly_above(over, self._num_turns, 99)

    def stopped_result(self, now_s: float, wall_s: float) -> dict[str, Any]:
        """What a stopped run reports: its JCT is longer than `jct_above_s`; with a TTFT limit, how
        many finished turns exceeded it (enough for the p99 to)."""
        b = self.bound
        return {
            "stopped": {"jct_above_s": now_s - self._start_s, "bound_jct_s": b.jct_s, "bound_ttft_p99_s": b.ttft_p99_s,
                        "turns_done": len(self._recorder.first_s), "turns": self._num_turns,
                        "turns_over_ttft": self._num_over if b.ttft_p99_s is not None else None},
            "wall_s": wall_s,
            "build": build_kind(),
        }
