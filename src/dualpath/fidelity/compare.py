"""The simulator's errors against the runtime, judged against the runtime's own spread.

Per metric, the runtime's repeats give a mean and a spread ((max - min) / mean); a simulation gives
a value and its relative error against that mean. A goal is judged only where the runtime can
resolve it:

    missed               |error| > goal
    spread exceeds goal  |error| <= goal, but the runtime's own spread is wider than the goal:
                         this number of repeats cannot tell whether the goal holds
    within spread        |error| <= spread <= goal: the error is below the runtime's own
                         run-to-run spread (the goal holds; the error is not resolved)
    met                  spread < |error| <= goal

`holds` is met or within spread. Results come from sim/results.py and runtime/apps/replay.py
(`summarise`): the same keys in both worlds.
"""

from __future__ import annotations

import math
from statistics import mean
from typing import Any, Callable, Sequence

from ..metrics.decisions import Decision, agreement

# The prediction's goals: relative error per metric (the simulator's value over the runtime's mean).
GOALS: dict[str, float] = {"jct_s": 0.05, "ttft_p50_s": 0.10, "ttft_p90_s": 0.15, "tpot_mean_s": 0.10}
HOLDS = ("met", "within spread")
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


def verdict(error: float, spread: float, goal: float) -> str:
    """The module docstring's rule."""
    if not abs(error) <= goal:
        return "missed"
    if spread > goal:
        return "spread exceeds goal"
    return "within spread" if abs(error) <= spread else "met"


def runtime_stats(runs: Sequence[dict]) -> dict[str, Any]:
    """Per metric, the runtime repeats' values, mean and spread; and each run's SNIC utilisation."""
    out: dict[str, Any] = {}
    for name, get in METRICS.items():
        values = [get(r) for r in runs]
        m = mean(values)
        out[name] = {"runs": values, "mean": m, "spread": (max(values) - min(values)) / m if m else 0.0}
    out["snic_utilisation"] = [_runtime_snic(r) for r in runs]
    return out


def errors(stats: dict[str, Any], sim_run: dict) -> dict[str, Any]:
    """Per metric, the simulated value and its error against the runtime's mean; the goal's verdict
    where the metric has one."""
    out: dict[str, Any] = {}
    for name, get in METRICS.items():
        sim = get(sim_run)
        row: dict[str, Any] = {"sim": sim, "rel_error": rel_error(sim, stats[name]["mean"])}
        if name in GOALS:
            row.update(goal=GOALS[name], verdict=verdict(row["rel_error"], stats[name]["spread"], GOALS[name]))
        out[name] = row
    out["snic_utilisation"] = list(sim_run["nic_utilisation"]["snic_read_by_node"])
    return out


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
            f", x{1 + s['decode_io_slowdown']:.2f} moving KV, + {1e3 * s['decode_join_s']:.0f} ms a join")


def _runtime_snic(run: dict) -> list[float | None]:
    return [v.get("utilisation") for _, v in sorted(run.get("snic", {}).items(), key=lambda kv: int(kv[0]))]


def compare_decisions(runtime_logs: Sequence[Sequence[Decision]], sim_log: Sequence[Decision]) -> dict[str, Any]:
    """The simulator's decisions against each runtime repeat's, and the repeats against each other
    (how reproducible the runtime's own decisions are)."""
    vs_sim = [agreement(log, sim_log).to_json() for log in runtime_logs]
    between = [agreement(runtime_logs[0], log).to_json() for log in runtime_logs[1:]]
    side = [a["same_side"] for a in vs_sim]
    return {"vs_sim": vs_sim, "runtime_repeats": between, "same_side_mean": mean(side) if side else math.nan,
            "side_goal": SIDE_AGREEMENT_GOAL, "side_met": bool(side) and min(side) >= SIDE_AGREEMENT_GOAL}
