"""Is the planner's first choice right? (`dualpath bench plan`)

Per case (a model, a GPU budget, a workload, an objective):

1. the planner as a user runs it (`dualpath plan`, default `--confirm`), timed, no cache;
2. the exhaustive answer: every shape and mode the budget allows simulated whole (an offline
   workload: each deployment at full scale, its k units' EP groups as planned, `dualpath sim` with
   the plan's `--set`s; an online one: the goodput search on every configuration, which simulates
   them whole);
3. regret: how much better the exhaustive best is than the first choice, both at full scale, on
   the objective (JCT, or goodput);
4. the first choice's predicted metrics (its unit's simulation) against its full-scale
   simulation, and the same unit-vs-whole error for every configuration whose unit is smaller
   than itself: the tolerance of simulating at unit scale.

The full-scale simulations are cached under OUT/cache (keyed by spec, seed and simulator code),
so a rerun only pays for what changed."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..experiments.batch import simulate_many
from ..experiments.common import Context
from ..pool.executor import Executor, SerialExecutor
from ..plan.search import Choice, Plan, PlanRequest, latencies, make_plan
from ..plan.space import configurations, shapes, unit_mode
from ..plan.workload import Generated, Trace

TRACE_SLICE = Path(__file__).resolve().parents[1] / "workloads" / "data" / "mooncake_conversation_slice.jsonl"


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    request: PlanRequest

    @property
    def online(self) -> bool:
        return self.request.workload.online


def cases() -> dict[str, Case]:
    """The committed cases: two models offline (a light and a storage-heavy load per node) and a
    Mooncake trace for goodput under the paper's online SLOs (docs/paper.md §6.4: TTFT 4 s is the
    paper's mean-TTFT SLO, used here for p99; TPOT 50 ms)."""
    out = [
        Case("ds27b_64gpu_32k_512", PlanRequest("ds-27b", 64, Generated(32768, 512, 1))),
        Case("ds27b_64gpu_64k_1024", PlanRequest("ds-27b", 64, Generated(65536, 1024, 1))),
        Case("ds660b_64gpu_64k_512", PlanRequest("ds-v3.2-660b", 64, Generated(65536, 512, 1))),
        Case("ds27b_32gpu_mooncake_goodput", PlanRequest("ds-27b", 32, Trace(str(TRACE_SLICE), 32768),
                                                         objective="goodput", slo_ttft_p99_s=4.0, slo_tpot_s=0.05)),
    ]
    return {c.name: c for c in out}


def check(case: Case, out_dir: Path, progress: Any, executor: Executor = SerialExecutor()) -> dict[str, Any]:
    """One case: the planner as `dualpath plan` runs it (on `executor`), then every configuration whole."""
    req = case.request
    started = time.monotonic()
    plan = make_plan(req, Context(out_dir, seed=_seed(req), progress=progress, use_disk_cache=False, executor=executor))
    plan_wall_s = time.monotonic() - started
    first = plan.ranked[0]
    ctx = Context(out_dir, seed=_seed(req), progress=progress, use_disk_cache=True, executor=executor)
    if case.online:
        every = make_plan(replace(req, confirm=10_000), ctx)
        full = {(c.estimate.shape.pd, c.estimate.mode): _metrics(c) for c in every.ranked}
        order = [(c.estimate.shape.pd, c.estimate.mode) for c in every.ranked]
        key = "goodput_rps"
    else:
        assert isinstance(req.workload, Generated)
        configs = configurations(shapes(req.model, req.gpus, req.workload.num_agents), req.modes)  # as deployed
        specs = [req.workload.whole_spec(req.model, s, m) for s, m in configs]
        results = simulate_many(ctx, specs)
        full = {(s.pd, m): _from_run(r, plan.demand.num_turns) for (s, m), r in zip(configs, results)}
        order = sorted(full, key=lambda k: (full[k]["jct_s"], k))
        key = "jct_s"
    mine = (first.estimate.shape.pd, first.estimate.mode)
    best = order[0]
    sign = 1 if key == "jct_s" else -1
    regret = sign * (full[mine][key] - full[best][key]) / full[best][key] if full[best][key] else 0.0
    units = [] if case.online else _unit_errors(req, plan, full, ctx)
    return {
        "name": case.name, "request": _request_json(req), "objective_key": key,
        "planner": {"first": {"pd": mine[0], "mode": mine[1]}, "predicted": first.predicted, "wall_s": plan_wall_s,
                    "simulated": len(plan.ranked) + len(plan.outranked), "stopped_at_bound": len(plan.outranked),
                    "pruned": len(plan.pruned), "estimated_only": len(plan.unconfirmed),
                    "ranked": [{"pd": c.estimate.shape.pd, "mode": c.estimate.mode} for c in plan.ranked]},
        "exhaustive": [{"pd": pd, "mode": m, **full[(pd, m)]} for pd, m in order],
        "best": {"pd": best[0], "mode": best[1]},
        "regret": max(0.0, regret),
        "first_choice_full": full[mine],
        "prediction_error": {k: _err(first.predicted[k], full[mine][k]) for k in ("jct_s", "ttft_p50_s", "ttft_p99_s", "tpot_s")},
        "unit_vs_whole": units,
    }


def _unit_errors(req: PlanRequest, plan: Plan, full: dict, ctx: Context) -> list[dict[str, Any]]:
    """Every shape simulated at a smaller unit against itself whole (same mode)."""
    assert isinstance(req.workload, Generated)
    reduced = [(s, m) for s, m in configurations(shapes(req.model, req.gpus, req.workload.num_agents), req.modes)
               if s.copies > 1]
    results = simulate_many(ctx, [req.workload.unit_spec(req.model, s, unit_mode(s, m)) for s, m in reduced])
    out = []
    for (s, m), r in zip(reduced, results):
        unit = _from_run(r, plan.demand.num_turns)
        whole = full[(s.pd, m)]
        out.append({"pd": s.pd, "unit_pd": s.unit_pd, "copies": s.copies, "mode": m,
                    **{f"{k}_error": _err(unit[k], whole[k]) for k in ("jct_s", "ttft_p50_s", "ttft_p99_s", "tpot_s")}})
    return out


def _metrics(c: Choice) -> dict[str, float]:
    return {**c.predicted, "load_factor": c.load_factor, "meets_slo": c.meets_slo}


def _from_run(r: dict[str, Any], num_turns: int) -> dict[str, float]:
    return {**latencies(r), "goodput_rps": num_turns / r["jct_s"]}


def _err(predicted: float, actual: float) -> float | None:
    return None if not actual else predicted / actual - 1


def _seed(req: PlanRequest) -> int:
    return getattr(req.workload, "seed", 1)


def _request_json(req: PlanRequest) -> dict[str, Any]:
    return {"model": req.model, "gpus": req.gpus, "workload": req.workload.describe(), "modes": list(req.modes),
            "objective": req.objective, "slo_ttft_p99_s": req.slo_ttft_p99_s, "slo_tpot_s": req.slo_tpot_s,
            "confirm": req.confirm}


def plot(report: dict[str, Any], path: Path) -> Path:
    from ..experiments.common import pyplot

    plt = pyplot()
    cases = report["cases"]
    fig, axes = plt.subplots(1, len(cases), figsize=(4.2 * len(cases), 4), squeeze=False)
    for ax, c in zip(axes[0], cases):
        key = c["objective_key"]
        rows = c["exhaustive"]
        first = (c["planner"]["first"]["pd"], c["planner"]["first"]["mode"])
        labels = [f"{r['pd']} {r['mode'].replace('dualpath', 'dp')}" for r in rows]
        colors = ["C3" if (r["pd"], r["mode"]) == first else "C0" for r in rows]
        ax.barh(range(len(rows)), [r[key] for r in rows], color=colors)
        ax.set_yticks(range(len(rows)), labels, fontsize=6)
        ax.invert_yaxis()
        ax.set_xlabel("JCT s (full scale)" if key == "jct_s" else "goodput turns/s")
        ax.set_title(f"{c['name']}\nregret {c['regret'] * 100:.1f}%, plan {c['planner']['wall_s']:.0f} s", fontsize=8)
    fig.suptitle("dualpath plan: first choice (red) among every configuration, simulated whole", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
