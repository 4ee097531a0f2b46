"""How fast the engines compute inside a running cluster, against the compute profile that timed
each step alone: a `SpeedModel` fitted to runtime runs' own forwards.

Each engine's timeline records every forward with its model time (the compute alone, without the
waits for KV or mail) and what the profile needs to predict it (calibration.py: `step_records`):
a prefill forward's tokens and (query, key) pairs, a decode step's batch and longest context. The
profile's curve (runtime/profile/calibrate.py: the prefill fit; the decode steps interpolated on their
measured grid, core/measured.py: StepGrid) predicts each one alone, at the drift measured before
its run. Inside a cluster the runs showed (`dualpath fidelity` on the dev workloads):

  - prefill: a forward takes its predicted time plus a roughly constant overhead (100-400 ms
    here: small forwards came out 1.3-1.6x the profile, forwards of seconds 1.0-1.1x), so
        model_s = prefill_scale * drift * curve + prefill_overhead_s        (least squares)
  - decode: a step while its own engine copies KV (H2D, layer streams, D2H through its CNIC
    arbiter: its threads share the engine's cores, sim/cpu_share.py) may be slower than one
    without; and the step in which a request joins the batch takes 20-40 ms more (its first
    step), so
        model_s = decode_scale * drift * curve * (1 + decode_io_slowdown * io)
                  + decode_join_s * drift * joins
    with `io` the fraction of the step the engine's KV copies spanned and `joins` the requests
    the step has that the engine's previous step had not (least squares).

The model reads forward times only, never a request's latency or a run's JCT. `dualpath fidelity`
fits it on calibration runs for the prediction and on the scored runs for the `replayed`
diagnostic (run.py), never the prediction on the runs it is scored on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import mean
from typing import Any, Sequence, Union

import numpy as np

from ..core.measured import StepGrid

ROLES = ("prefill", "decode")


@dataclass(frozen=True, slots=True)
class Drift:
    """The machine's speed now over the profile's, per role (calibration.py: DriftCheck): a
    role's steps take this many times their profiled time. A float is the same for both roles."""

    prefill: float = 1.0
    decode: float = 1.0

    @staticmethod
    def of(value: "DriftLike") -> "Drift":
        if isinstance(value, Drift):
            return value
        if isinstance(value, dict):
            return Drift(float(value["prefill"]), float(value["decode"]))
        return Drift(float(value), float(value))

    @staticmethod
    def mean(drifts: Sequence["DriftLike"]) -> "Drift":
        ds = [Drift.of(d) for d in drifts]
        return Drift(mean(d.prefill for d in ds), mean(d.decode for d in ds)) if ds else Drift()

    def toward(self, other: "Drift", share: float) -> "Drift":
        """The drift `share` of the way from this one to `other` (linear, per role)."""
        return Drift(self.prefill + (other.prefill - self.prefill) * share,
                     self.decode + (other.decode - self.decode) * share)

    def to_json(self) -> dict[str, float]:
        return asdict(self)


DriftLike = Union[Drift, float, dict]


@dataclass(frozen=True, slots=True)
class SpeedModel:
    """Factors on the cached profile (module docstring); the default is the profile as measured."""

    prefill_scale: float = 1.0
    prefill_overhead_s: float = 0.0
    decode_scale: float = 1.0
    decode_io_slowdown: float = 0.0
    decode_join_s: float = 0.0

    def to_json(self) -> dict[str, float]:
        return asdict(self)

    def drifted(self, drift: DriftLike, fitted_at_drift: DriftLike = 1.0) -> "SpeedModel":
        """The same contention on a machine `drift` times the profile's, each role at its own
        drift (the overheads, seconds measured at `fitted_at_drift`, scale with it)."""
        now, then = Drift.of(drift), Drift.of(fitted_at_drift)
        return SpeedModel(self.prefill_scale * now.prefill, self.prefill_overhead_s * now.prefill / then.prefill,
                          self.decode_scale * now.decode, self.decode_io_slowdown,
                          self.decode_join_s * now.decode / then.decode)


def decode_grid(profile: Any) -> StepGrid | None:
    """The profile's measured decode steps as a grid (None when they do not form one)."""
    try:
        return StepGrid.of([(p.tokens, p.context_tokens, p.seconds) for p in getattr(profile, "decode", ())])
    except ValueError:
        return None


def curve_s(profile: Any, grid: StepGrid | None, role: str, a: float, b: float) -> float:
    """The profile's seconds for one forward alone: prefill (tokens a, keys b); decode (batch a,
    longest context b), on the measured grid when there is one."""
    if role == "prefill":
        f = profile.prefill_fit
        return f.fixed_s + f.per_item_s * a + f.per_key_s * b
    if grid is not None:
        return grid.step_s(a, b)
    f = profile.decode_fit
    return f.fixed_s + f.per_item_s * a + f.per_ctx_s * b + f.per_key_s * a * b


def fit_speed(profile: Any, runs: Sequence[tuple[dict, DriftLike]]) -> SpeedModel:
    """The SpeedModel of runs given as (step records, the run's drift); a role without forwards
    keeps the profile's speed."""
    grid = decode_grid(profile)
    pre_x, pre_y, dec = [], [], []
    for steps, drift in runs:
        d = Drift.of(drift)
        for tokens, keys, model_s, *_ in steps["prefill"]:
            pre_x.append(d.prefill * curve_s(profile, grid, "prefill", tokens, keys))
            pre_y.append(model_s)
        for batch, ctx, model_s, _, _, joins, io in steps["decode"]:
            dec.append((d.decode * curve_s(profile, grid, "decode", batch, ctx), io, joins * d.decode, model_s))
    scale_p, overhead_p = _affine(np.array(pre_x), np.array(pre_y))
    scale_d, slowdown, join_s = _decode(np.array(dec).reshape(-1, 4))
    return SpeedModel(scale_p, overhead_p, scale_d, slowdown, join_s)


def _affine(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares y = a x + b with a > 0 and b >= 0 (b = 0 refitted when negative)."""
    if x.size == 0:
        return 1.0, 0.0
    if x.size >= 2 and np.ptp(x) > 0:
        a, b = np.linalg.lstsq(np.column_stack([x, np.ones_like(x)]), y, rcond=None)[0]
        if a > 0 and b >= 0:
            return float(a), float(b)
    return float(y.sum() / x.sum()), 0.0


def _decode(rows: np.ndarray) -> tuple[float, float, float]:
    """Least squares model_s = x (a + c io) + j joins over rows (x, io, joins, model_s) with a > 0 and
    c, j >= 0: (a, c / a, j). A term whose coefficient comes out negative, or whose column is
    constant zero, is dropped and the rest refitted."""
    if rows.size == 0:
        return 1.0, 0.0, 0.0
    x, f, joins, y = rows.T
    columns = {"a": x, "c": x * f, "j": joins}
    keep = [k for k in columns if k == "a" or np.any(columns[k] > 0)]
    while True:
        coef = dict(zip(keep, np.linalg.lstsq(np.column_stack([columns[k] for k in keep]), y, rcond=None)[0]))
        negative = [k for k in keep if k != "a" and coef[k] < 0]
        if not negative:
            break
        keep.remove(negative[0])
    a = coef["a"] if coef["a"] > 0 else float(y.sum() / x.sum())
    return float(a), float(coef.get("c", 0.0) / a), float(coef.get("j", 0.0))
