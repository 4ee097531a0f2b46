"""The simulator's errors against the runtime, judged against how well the repeats determine them.

Per metric, the runtime's repeats give a mean, a spread ((max - min) / mean: how far apart single
runs land) and `noise`: the half-width of the 90% confidence interval of their mean, relative to
it (Student's t with n - 1 degrees of freedom times the standard deviation over sqrt(n); one run
alone knows nothing of its noise: infinite).

The prediction is paired with the runs: each runtime run is simulated at the speed measured beside
it (run.py: the drift checks around its cluster), so a run on a slower machine is predicted
slower, and the error is the mean over the runs of sim / real, less one (`paired`). Its noise is
that mean's 90% confidence half-width: how consistently the simulator lands on each run, with the
machine's measured speed taken out, and what the runs cannot take out left in. The goal bounds
that error, so the verdict reads its noise, not a single run's spread; the runtime's own spread
and noise are reported beside it:

    missed               |error| > goal
    noise exceeds goal   |error| <= goal, but the error is uncertain by more than the goal:
                         these repeats cannot tell whether the goal holds
    within noise         |error| <= noise <= goal: the error is below its own uncertainty (the
                         goal holds; the error itself is not resolved)
    met                  noise < |error| <= goal

`holds` is met or within noise. With three repeats a noise is about 1.7 standard deviations of its
values either way, with five about 0.95. Results come from sim/results.py and
runtime/apps/replay.py (`summarise`): the same keys in both worlds.
"""

from __future__ import annotations

import math
from statistics import mean, stdev
from typing import Any, Callable, Sequence

from ..metrics.decisions import Decision, agreement

# The prediction's goals: relative error per metric (the simulator's value over the runtime's, `paired`).
GOALS: dict[str, float] = {"jct_s": 0.05, "ttft_p50_s": 0.10, "ttft_p90_s": 0.15, "tpot_mean_s": 0.10}
HOLDS = ("met", "within noise")
# Student's t at 0.95 for 1..10 degrees of freedom (a 90% two-sided interval; any statistics table,
# e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2); beyond 10 the value of 10, which overstates the noise.
T_95_BY_DF = (6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812)
SIDE_AGREEMENT_GOAL = 0.95  # read side chosen alike, request by request (a diagnostic)

METRICS: dict[str, Callable[[dict], float]] = {
    "jct_s": lambda r: r["jct_s"],
    "ttft_p50_s": lambda r: r["ttft_s"]["p50"],
    "ttft_p90_s": lambda r: r["ttft_s"]["p90"],
    "ttst_mean_s": lambda r: r["ttst_s"]["mean"],
    "tpot_mean_s": lambda r: r["tpot_s"]["mean"],
    "pe_path_bytes": lambda r: float(r["bytes"]["storage_to_prefill"]),
    "de_path_bytes": lambda r: float(r["bytes"]["storage_via_decode"]),
    # diagnostic: the DEs' model time per decode step (runtime: the forward alone, its loop's other
    # work excluded; simulator: its modelled step); TPOT minus it is the runtime's per-step overhead
    "de_step_s": lambda r: r.get("de_step_s", math.nan),
    # diagnostic: sequences per decode step, averaged over steps (a step-time error splits into
    # batch composition and the time of a step of a given batch)
    "de_batch_mean": lambda r: r.get("de_batch_mean", math.nan),
    # diagnostic: hit tokens fixed at placement, summed (the bytes read follow them, not the decisions')
    "placed_hit_tokens": lambda r: float(r.get("cached_tokens", math.nan)),
}


def rel_error(sim: float, real: float) -> float:
    if real == 0:
        return 0.0 if sim == 0 else math.inf
    return sim / real - 1.0


def verdict(error: float, noise: float, goal: float) -> str:
    """The module docstring's rule."""
    if not abs(error) <= goal:
        return "missed"
    if not noise <= goal:
        return "noise exceeds goal"
    return "within noise" if abs(error) <= noise else "met"


def half_width(values: Sequence[float]) -> float:
    """The 90% confidence half-width of the mean of `values` (Student's t; one value: infinite)."""
    n = len(values)
    if n < 2:
        return math.inf
    return T_95_BY_DF[min(n - 1, len(T_95_BY_DF)) - 1] * stdev(values) / math.sqrt(n)


def mean_noise(values: Sequence[float]) -> float:
    """`half_width` relative to the mean of `values` (module docstring)."""
    m = mean(values)
    if m == 0:
        return 0.0 if not any(values) else math.inf
    return half_width(values) / abs(m)


def runtime_stats(runs: Sequence[dict]) -> dict[str, Any]:
    """Per metric, the runtime repeats' values, mean and spread; and each run's SNIC utilisation."""
    out: dict[str, Any] = {}
    for name, get in METRICS.items():
        values = [get(r) for r in runs]
        m = mean(values)
        out[name] = {"runs": values, "mean": m, "spread": (max(values) - min(values)) / m if m else 0.0,
                     "noise": mean_noise(values)}
    out["snic_utilisation"] = [_runtime_snic(r) for r in runs]
    return out


def errors(stats: dict[str, Any], sim_runs: Sequence[dict]) -> dict[str, Any]:
    """Per metric, the simulations' values (one per runtime run, in the runs' order), their mean,
    the error and its noise (`paired`); the goal's verdict where the metric has one."""
    out: dict[str, Any] = {}
    for name, get in METRICS.items():
        sims = [get(r) for r in sim_runs]
        row: dict[str, Any] = {"sim": mean(sims), "sim_runs": sims, **paired(sims, stats[name]["runs"])}
        if name in GOALS:
            row.update(goal=GOALS[name], verdict=verdict(row["rel_error"], row["noise"], GOALS[name]))
        out[name] = row
    out["snic_utilisation"] = list(sim_runs[0]["nic_utilisation"]["snic_read_by_node"])
    return out


def paired(sims: Sequence[float], reals: Sequence[float]) -> dict[str, float]:
    """Each runtime run against the simulation of that run: the error is the mean of sim / real
    over the runs, less one, and its noise the 90% confidence half-width of that mean (module
    docstring). Where a run's value is 0 (nothing to divide by), the error of the means and no noise."""
    if len(sims) != len(reals):
        raise ValueError(f"{len(sims)} simulations for {len(reals)} runs")
    if any(r == 0 for r in reals):
        return {"rel_error": rel_error(mean(sims), mean(reals)), "noise": math.nan}
    ratios = [s / r for s, r in zip(sims, reals)]
    return {"rel_error": mean(ratios) - 1.0, "noise": half_width(ratios)}


def causes(predicted: dict[str, Any], replayed: dict[str, Any], speeds: dict[str, dict[str, float]]) -> dict[str, str]:
    """For each goal the prediction does not hold, what the runs measured of why: the replayed
    simulator (the same model at the scored runs' own speed) is within the goal, so the
    calibration's speed did not carry over; or it misses too, so the model misses whatever the
    speed."""
    out: dict[str, str] = {}
    for name in GOALS:
        if predicted[name]["verdict"] in HOLDS:
            continue
        if abs(replayed[name]["rel_error"]) <= GOALS[name]:
            out[name] = (f"speed: at the scored runs' own speed the error is {100 * replayed[name]['rel_error']:+.1f}%; "
                         f"the prediction's speed ({describe_speed(speeds['predicted'])}) is not theirs "
                         f"({describe_speed(speeds['replayed'])})")
        else:
            out[name] = (f"model: at the scored runs' own speed the error is still "
                         f"{100 * replayed[name]['rel_error']:+.1f}%")
    return out


def describe_speed(s: dict[str, float]) -> str:
    """A SpeedModel's JSON in a few words (fidelity/speed.py)."""
    return (f"prefill x{s['prefill_scale']:.3f} + {1e3 * s['prefill_overhead_s']:.0f} ms, decode x{s['decode_scale']:.3f}"
            f", x{1 + s['decode_io_slowdown']:.2f} copying KV, + {1e3 * s['decode_join_s']:.0f} ms a join")


def _runtime_snic(run: dict) -> list[float | None]:
    return [v.get("utilisation") for _, v in sorted(run.get("snic", {}).items(), key=lambda kv: int(kv[0]))]


def compare_decisions(runtime_logs: Sequence[Sequence[Decision]], sim_logs: Sequence[Sequence[Decision]],
                      tie_tokens: int = 0) -> dict[str, Any]:
    """Each runtime repeat's decisions against its own simulation's, and the repeats against each
    other (how reproducible the runtime's own decisions are); `tie_tokens` (a block): how many of the
    read sides that differ were near-ties (metrics/decisions.py `near_tie`)."""
    vs_sim = [agreement(log, sim_log, tie_tokens).to_json() for log, sim_log in zip(runtime_logs, sim_logs, strict=True)]
    between = [agreement(runtime_logs[0], log, tie_tokens).to_json() for log in runtime_logs[1:]]
    side = [a["same_side"] for a in vs_sim]
    return {"vs_sim": vs_sim, "runtime_repeats": between, "same_side_mean": mean(side) if side else math.nan,
            "side_goal": SIDE_AGREEMENT_GOAL, "side_met": bool(side) and min(side) >= SIDE_AGREEMENT_GOAL}
