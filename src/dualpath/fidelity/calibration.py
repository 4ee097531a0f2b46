"""The machine's speed for a prediction, measured without looking at the runs it predicts.

The compute profile (`dualpath calibrate`, runtime/apps/calibrate.py) times each prefill and decode
step alone, in a process pinned to an engine's CPU set. A prediction scales it by two factors:

1. Drift: a shared machine's speed moves within minutes. Right before every runtime run (the
   calibration's and the scored ones) the profile's warm points are timed again
   (`calibrate.check_speed`); `drift` is the median of now / cached. The prediction of the scored
   runs takes the mean of the drifts measured before them: a measurement made before each run,
   never of it.
2. Contention: inside a running cluster an engine's forwards take longer than the profile timed
   them alone; the other engine, the router and the client share the cores, caches and memory, and
   how much they do differs by mode (a dualpath decode engine also reads and copies). Per mode and
   role, it is measured on a calibration workload, which is never the scored one:

       contention = sum(model seconds) / sum(drift_run * profile's seconds for the same forwards)

   over the calibration runs of that mode (speed.py: the profile's seconds from each run's
   `Counters.fit_terms`).

So the predicted profile is the cached one times mean(drift of the scored runs) times the
calibration's contention, per role. The scored runs' own model time gives the `replayed` speed
(speed.py: `in_run_speed`), a diagnostic that says how much of an error is the speed and how much
the model of everything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from statistics import mean
from typing import Any, Sequence

from .speed import ROLES, predicted_s


@dataclass(frozen=True, slots=True)
class DriftCheck:
    """Times the profile's warm points again (a process pinned as the profile's measurement)."""

    model: str
    device: str

    def __call__(self, calibration: Any) -> float:
        from ..config import RuntimeConfig
        from ..runtime.apps.calibrate import check_speed
        from ..runtime.engine.cpus import available_cpus, plan_cpus

        cfg = RuntimeConfig(model=self.model, device=self.device)
        cpus = plan_cpus(range(2), available_cpus(), cfg.torch_threads).cpus_by_engine[0]
        # as a reused profile, so that check_speed times it whether or not this call measured it
        return check_speed(replace(calibration, reused=True), self.model, cpus).speed_now_over_cached


@dataclass(slots=True)
class CalibrationRuns:
    """The calibration workloads' runtime runs, each with the drift measured right before it."""

    workloads: list[str] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)  # runtime results (runtime/apps/demo.py: run_workload)
    drifts: list[float] = field(default_factory=list)  # per run, the drift before its cluster's first mode
    wall_s: float = 0.0

    def add(self, workload: str, runs: Sequence[dict], drift: float) -> None:
        for run in runs:
            self.workloads.append(workload)
            self.runs.append(run)
            self.drifts.append(drift)

    def contention(self, profile: Any, mode: str) -> dict[str, float]:
        """Per role, the mode's calibration model time over the drifted profile's seconds (module
        docstring); 1.0 for a role none of its runs computed on."""
        out: dict[str, float] = {}
        for role, fit in zip(ROLES, (profile.prefill_fit, profile.decode_fit)):
            busy = pred = 0.0
            for run, drift in zip(self.runs, self.drifts):
                t = run.get("model_time", {}).get(role) if run["mode"] == mode else None
                if t:
                    busy += t["busy_s"]
                    pred += drift * predicted_s(fit, t["forwards"], t["fit_terms"])
            out[role] = busy / pred if busy > 0 and pred > 0 else 1.0
        return out

    def to_json(self, profile: Any, modes: Sequence[str]) -> dict[str, Any]:
        return {"workloads": sorted(set(self.workloads)), "drift": self.drifts, "wall_s": self.wall_s,
                "contention": {m: self.contention(profile, m) for m in modes},
                "runs": [{"workload": w, "mode": r["mode"], "jct_s": r["jct_s"], "model_time": r.get("model_time")}
                         for w, r in zip(self.workloads, self.runs)]}


def predicted_speed(contention: dict[str, float], drifts: Sequence[float]) -> dict[str, float]:
    """Per role, the factor on the cached profile that predicts the scored runs."""
    d = mean(drifts) if drifts else 1.0
    return {role: d * contention[role] for role in ROLES}
