"""Per-metric errors of the simulator against the runtime (issue 15's goals), from two results
with the same run keys (sim/results.py, runtime/apps/replay.py: `summarise`)."""

from __future__ import annotations

import math
from statistics import mean
from typing import Any, Callable, Sequence

from ..metrics.decisions import Decision, agreement

# Goals (issue 15): relative error bounds per metric; the read side's agreement is a fraction.
GOALS: dict[str, float] = {"jct_s": 0.05, "ttft_p50_s": 0.10, "tpot_mean_s": 0.10,
                           "pe_path_bytes": 0.02, "de_path_bytes": 0.02}
SIDE_AGREEMENT_GOAL = 0.95

_METRICS: dict[str, Callable[[dict], float]] = {
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


def _rel(sim: float, real: float) -> float:
    if real == 0:
        return 0.0 if sim == 0 else math.inf
    return sim / real - 1.0


def compare_mode(runtime_runs: Sequence[dict], sim_run: dict) -> dict[str, Any]:
    """One mode: per metric the runtime's mean and spread over its repeats, the simulator's value,
    the relative error and whether the goal holds (and whether the runtime's own spread is above it)."""
    out: dict[str, Any] = {}
    for name, get in _METRICS.items():
        real = [get(r) for r in runtime_runs]
        m = mean(real)
        spread = (max(real) - min(real)) / m if m else 0.0
        sim = get(sim_run)
        err = _rel(sim, m)
        row: dict[str, Any] = {"runtime_mean": m, "runtime_runs": real, "runtime_spread": spread, "sim": sim,
                               "rel_error": err}
        if name in GOALS:
            row["goal"] = GOALS[name]
            row["met"] = abs(err) <= GOALS[name]
            row["spread_exceeds_goal"] = spread > GOALS[name]
        out[name] = row
    out["snic_utilisation"] = {"runtime": [_runtime_snic(r) for r in runtime_runs],
                               "sim": list(sim_run["nic_utilisation"]["snic_read_by_node"])}
    return out


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
