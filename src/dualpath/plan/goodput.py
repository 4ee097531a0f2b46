"""Goodput: the most load a configuration carries within the SLOs (`--objective goodput`).

An online workload (`--aps`, or a trace at its timestamps) is replayed at a load factor f: the
agents' arrival rate times f, or the trace's timestamps divided by f. Per configuration the search
starts at the load where the analytic estimate saturates its busiest resource, doubles or halves
f until the SLOs flip, then bisects (geometric midpoints) until the
highest f known to meet them is within `TOLERANCE` of the lowest known to miss them. Every
configuration advances one step per round, and a round's simulations go out as one batch (on Ray
with `--ray`). The goodput is the turns per second of the run at the highest f that met the SLOs;
a configuration that misses them at the lowest load tried has none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .analytic import Estimate

TOLERANCE = 0.05  # project choice: f known to 5%, about what seed-to-seed noise allows
MIN_LOAD, MAX_LOAD = 1 / 64, 64.0  # project choice: the range searched, either side of the given load


@dataclass(slots=True)
class LoadSearch:
    """One configuration's bracket: `met` the highest load that met the SLOs (its run kept),
    `missed` the lowest that missed them."""

    estimate: Estimate
    start: float = 1.0
    met: float | None = None
    missed: float | None = None
    met_run: dict[str, Any] | None = None
    lowest_run: tuple[float, dict[str, Any]] | None = None
    runs: int = 0
    history: list[tuple[float, bool]] = field(default_factory=list)

    def next_load(self) -> float | None:
        """The next load to try, or None when the bracket is tight or at a limit."""
        if self.met is None and self.missed is None:
            return self.start
        if self.met is None:
            assert self.missed is not None
            return None if self.missed <= MIN_LOAD else self.missed / 2
        if self.missed is None:
            return None if self.met >= MAX_LOAD else self.met * 2
        if self.missed / self.met <= 1 + TOLERANCE:
            return None
        return math.sqrt(self.met * self.missed)

    def record(self, load: float, meets: bool, run: dict[str, Any]) -> None:
        self.runs += 1
        self.history.append((load, meets))
        if meets:
            self.met, self.met_run = load, run
        else:
            self.missed = load
        if self.lowest_run is None or load < self.lowest_run[0]:
            self.lowest_run = (load, run)

    @property
    def reported(self) -> tuple[float, dict[str, Any]]:
        """The run the plan reports: at the highest load that met the SLOs, else the lowest tried."""
        if self.met is not None and self.met_run is not None:
            return self.met, self.met_run
        assert self.lowest_run is not None
        return self.lowest_run


def saturating_load(e: Estimate) -> float:
    """The load at which the estimate's busiest resource would be busy the whole arrival span: the
    search starts there (within the limits), where the SLOs are likely to flip."""
    span = e.busy_s.get("arrivals", 0.0)
    work = max((v for k, v in e.busy_s.items() if k not in ("arrivals", "agent chain")), default=0.0)
    if span <= 0 or work <= 0:
        return 1.0
    return min(MAX_LOAD, max(MIN_LOAD, span / work))


def search(estimates: Sequence[Estimate], simulate: Callable[[list[tuple[Estimate, float]]], list[dict[str, Any]]],
           meets: Callable[[dict[str, Any]], bool]) -> list[LoadSearch]:
    """Bracket every configuration's highest load within the SLOs, all in lock step, each starting
    at its saturating load."""
    searches = [LoadSearch(e, saturating_load(e)) for e in estimates]
    while True:
        todo = [(s, load) for s in searches if (load := s.next_load()) is not None]
        if not todo:
            return searches
        runs = simulate([(s.estimate, load) for s, load in todo])
        for (s, load), run in zip(todo, runs):
            s.record(load, meets(run), run)
