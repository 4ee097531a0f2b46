"""The machine's speed for a prediction, measured without looking at the runs it predicts.

The compute profile (`dualpath calibrate`, runtime/profile/calibrate.py) times each prefill and decode
step alone, in a process pinned to an engine's CPU set. A prediction corrects it twice:

1. Drift: a shared machine's speed moves within minutes. Right before and right after every
   runtime run (the calibration's and the scored ones; a cluster runs every mode in turn, and is
   checked between two modes while idle) some of the profile's prefill and decode points are
   timed again (`calibrate.check_drift`); the drift of each role is the median of now / cached over
   its points (`speed.Drift`): a prefill check alone, applied to decode too, moved the decode
   prediction the wrong way on two held-out runs (docs/results.md). The session's checks, in time
   order, are smoothed by a running median of three (`smoothed`): one check that reads the machine
   far from the checks beside it (a prefill check read 1.32 between checks of 0.86-1.02 on a
   held-out run) moves no run. Each run is given the drift at its middle, halfway between the
   smoothed checks right before and right after it. Each scored run is predicted at its
   own drift (compare.py: `paired`); the calibration's speed is fitted at the drifts of its runs:
   measurements made beside each run, never of it.
2. Contention: inside a running cluster the engines' forwards take longer than the profile timed
   them alone, by how much depending on the forward and on what runs beside it (speed.py: the
   `SpeedModel`: a per-forward overhead for prefill; for decode, a slowdown while the engine copies
   KV and the cost of a join). It is fitted on the forwards of the calibration workloads' runs, which
   are never the scored workload, each at its run's drift, every mode's runs
   together: the engines compute alike whichever mode schedules them, and what a mode changes (how
   much KV a decode engine copies during its steps, which requests join its batches) is measured per
   step and is in the model's terms. One fit over all the runs has twice the forwards of a fit per
   mode; fitted per mode on a short calibration, the decode scale and its slowdown while copying KV
   traded off against each other (0.96 and x1.33 for basic, 1.30 and x1.09 for dualpath, on one
   machine minutes apart: the per-mode fit's calibration of the agents workload scored on
   2026-12-05, whose scored runs' own fits agreed across modes, 0.97 / x1.23 and 0.92 / x1.23).

So the prediction runs the profile at `SpeedModel` fitted on the calibration runs, moved from
their drift to each scored run's (`SpeedModel.drifted`). The same model fitted on the scored runs'
own forwards gives the `replayed` diagnostic, which says how much of an error is the speed and how
much the model of everything else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Any, Sequence

from .speed import Drift, SpeedModel, fit_speed


@dataclass(frozen=True, slots=True)
class DriftCheck:
    """Times some of the profile's prefill and decode points again (a process pinned as the
    profile's measurement): the Drift now."""

    model: str
    device: str

    def __call__(self, calibration: Any) -> Drift:
        from ..config import RuntimeConfig
        from ..runtime.profile.calibrate import check_drift
        from ..runtime.engine.cpus import available_cpus, plan_cpus

        cfg = RuntimeConfig(model=self.model, device=self.device)
        cpus = plan_cpus(range(2), available_cpus(), cfg.engines.torch_threads).cpus_by_engine[0]
        return Drift(*check_drift(calibration, self.model, cpus))


@dataclass(slots=True)
class CalibrationRuns:
    """The calibration workloads' runtime runs, each with the drift measured right before it."""

    workloads: list[str] = field(default_factory=list)
    runs: list[dict] = field(default_factory=list)  # runtime results (runtime/apps/demo.py: run_workload)
    drifts: list[Drift] = field(default_factory=list)  # per run, the drift at its middle (run.py: _drifts)
    last_after: Drift | None = None  # the check after the last cluster (the scored runs' first check)
    wall_s: float = 0.0

    def add(self, workload: str, runs: Sequence[dict], drifts: Sequence[Any]) -> None:
        """A cluster's runs, each with its drift."""
        for run, drift in zip(runs, drifts, strict=True):
            self.workloads.append(workload)
            self.runs.append(run)
            self.drifts.append(Drift.of(drift))

    def speed(self, profile: Any) -> SpeedModel:
        """The SpeedModel over every calibration run, each at its drift (speed.py; module docstring:
        every mode's runs together)."""
        return fit_speed(profile, list(zip((r["steps"] for r in self.runs), self.drifts)))

    def mean_drift(self) -> Drift:
        return Drift.mean(self.drifts)

    def to_json(self, profile: Any) -> dict[str, Any]:
        return {"workloads": sorted(set(self.workloads)), "drift": [d.to_json() for d in self.drifts],
                "drift_after": None if self.last_after is None else self.last_after.to_json(),
                "wall_s": self.wall_s,
                "speed": self.speed(profile).to_json(),
                "runs": [{"workload": w, "mode": r["mode"], "jct_s": r["jct_s"], "model_time": r.get("model_time"),
                          "steps": r.get("steps")} for w, r in zip(self.workloads, self.runs)]}


def smoothed(checks: Sequence[Any]) -> list[Drift]:
    """The session's checks in time order, each role's reading replaced by the median of itself and
    its two neighbours (a running median of three; an end by the median of the three at that end):
    one check that reads the machine far from the checks beside it moves no run's drift, while a
    level that two checks in a row agree on is kept. Fewer than three checks stay as they are."""
    ds = [Drift.of(c) for c in checks]
    if len(ds) < 3:
        return ds
    out = []
    for i in range(len(ds)):
        lo = min(max(i - 1, 0), len(ds) - 3)
        window = ds[lo:lo + 3]
        out.append(Drift(median(d.prefill for d in window), median(d.decode for d in window)))
    return out


# The spans of a decode engine's own KV copies (runtime/engine: decode.py, kv_stream.py), on its CNIC track
KV_COPIES = ("h2d", "transfer", "d2h")


def step_records(trace: dict[str, Any]) -> dict[str, list[list[float]]]:
    """A runtime run's forwards from its timeline (metrics/timeline.py; the engines' span args), in
    time order: prefill [tokens, keys, model seconds, start s, end s]; decode [batch, longest
    context, model seconds, start s, end s, joins (its requests that the engine's previous step
    did not have), io (the fraction of the step its engine spent copying KV: its CNIC track's H2D,
    layer streams and D2H spans; sim/cpu_share.py says why its node's SNIC spans do not count)]."""
    from ..metrics.timeline import read_trace

    spans, _ = read_trace(trace)
    io: dict[str, list[tuple[float, float]]] = {}  # per decode track, its engine's KV copies
    for s in spans:
        track = _decode_track_of(s.track)
        if track is not None and s.name in KV_COPIES:
            io.setdefault(track, []).append((s.start_s, s.end_s))
    out: dict[str, list[list[float]]] = {"prefill": [], "decode": []}
    previous: dict[str, set] = {}  # per decode engine, the last step's requests
    for s in sorted(spans, key=lambda s: s.start_s):
        if s.name == "prefill":
            out["prefill"].append([s.args["tokens"], s.args["keys"], s.args["model_s"], s.start_s, s.end_s])
        elif s.name == "decode":
            now = set(s.requests)
            joins = len(now - previous.get(s.track, set()))
            previous[s.track] = now
            out["decode"].append([s.args["batch"], s.args["ctx"], s.args["model_s"], s.start_s, s.end_s, joins,
                                  _covered(s.start_s, s.end_s, io.get(s.track, []))])
    return out


def _decode_track_of(track: str) -> str | None:
    """The decode engine whose copies a CNIC track carries (`CNIC DE<j>`, or a lane of it
    `CNIC DE<j> (2)`), or None."""
    name = track.split(" (")[0]
    return name.removeprefix("CNIC ") if name.startswith("CNIC DE") else None


def _covered(t0: float, t1: float, spans: list[tuple[float, float]]) -> float:
    """The fraction of [t0, t1) that the union of `spans` covers."""
    if t1 <= t0:
        return 0.0
    cuts = sorted((max(a, t0), min(b, t1)) for a, b in spans if b > t0 and a < t1)
    covered, reach = 0.0, t0
    for a, b in cuts:
        if b > reach:
            covered += b - max(a, reach)
            reach = b
    return covered / (t1 - t0)


def predicted_speed(calibrated: SpeedModel, calibration_drift: Any, drifts: Sequence[Any]) -> SpeedModel:
    """The calibration's SpeedModel on the machine of the scored runs (the mean of their drifts)."""
    return calibrated.drifted(Drift.mean(drifts), calibration_drift)
