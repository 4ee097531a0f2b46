"""A plan's outputs: the JSON (`ranked` best first, `outranked`: stopped at their bound, then what
was not simulated and why), the
command lines that realise a choice, and the frontier plot (estimated JCT of every shape and mode
against P/D, the simulated predictions on top)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._build import build_kind
from ..parsing import format_tokens
from .analytic import Estimate
from .goodput import saturating_load
from .search import Choice, Plan


def commands(plan: Plan, c: Choice) -> dict[str, str]:
    """`dualpath sim` of the whole configuration and of the unit simulated (at the load reported),
    and `dualpath serve` with one engine per node in each role, its engines as Ray actors."""
    req, shape, mode = plan.request, c.estimate.shape, c.estimate.mode
    wl = req.workload.at_load(c.load_factor)  # goodput: the highest load that met the SLOs
    return {
        "sim": f"dualpath sim --model {req.model} --pd {shape.pd} --mode {mode} {wl.sim_flags(shape, unit=False)}",
        "unit_sim": f"dualpath sim --model {req.model} --pd {shape.unit_pd} --mode {mode} {wl.sim_flags(shape, unit=True)}",
        "serve": f"dualpath serve --pd {shape.pd} --mode {mode} --ray auto",
    }


def to_json(plan: Plan, wall_s: float) -> dict[str, Any]:
    req = plan.request
    return {
        "request": {
            "model": req.model, "gpus": req.gpus, "workload": req.workload.describe(), "modes": list(req.modes),
            "objective": req.objective,
            "slo_ttft_p99_s": req.slo_ttft_p99_s, "slo_tpot_s": req.slo_tpot_s, "confirm": req.confirm, "bound": req.bound,
        },
        "demand": {"agents": plan.demand.num_agents, "turns": plan.demand.num_turns, "hit_tokens": plan.demand.hit_tokens,
                   "miss_tokens": plan.demand.miss_tokens, "gen_tokens": plan.demand.gen_tokens},
        "ranked": [_choice_json(plan, c) for c in plan.ranked],
        "outranked": [{"pd": o.estimate.shape.pd, "mode": o.estimate.mode, "jct_above_s": o.jct_above_s,
                       "bound_jct_s": o.bound_jct_s, "misses_ttft_slo": o.misses_ttft,
                       "estimate": _estimate_json(o.estimate)} for o in plan.outranked],
        "unconfirmed": [_estimate_json(e) for e in plan.unconfirmed],
        "pruned": [_estimate_json(e) for e in plan.pruned],
        "any_meets_slo": any(c.meets_slo for c in plan.ranked),
        "wall_s": wall_s,
        "build": build_kind(),  # the simulator's build in this process: 'pure' or 'compiled' (wall_s only)
    }


def _choice_json(plan: Plan, c: Choice) -> dict[str, Any]:
    return {
        "pd": c.estimate.shape.pd, "mode": c.estimate.mode, "unit_pd": c.estimate.shape.unit_pd,
        "copies": c.estimate.shape.copies,
        "predicted": c.predicted, "meets_slo": c.meets_slo, "binding": c.estimate.binding,
        "load_factor": c.load_factor, "simulations": c.runs,
        "estimate": _estimate_json(c.estimate), "utilisation": c.utilisation, "commands": commands(plan, c),
    }


def _estimate_json(e: Estimate) -> dict[str, Any]:
    """`saturating_load` (online): the load factor at which the busiest resource would be busy for
    the whole arrival span (goodput.py); None offline."""
    online = "arrivals" in e.busy_s
    return {"pd": e.shape.pd, "mode": e.mode, "jct_s": e.jct_s, "binding": e.binding, "busy_s": e.busy_s,
            "out_of_range": e.out_of_range, "saturating_load": saturating_load(e) if online else None}


def plot(plan: Plan, path: Path) -> Path:
    from ..experiments.common import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    everything = [c.estimate for c in plan.ranked] + [o.estimate for o in plan.outranked]
    everything += plan.unconfirmed + plan.pruned
    for i, mode in enumerate(plan.request.modes):
        pts = sorted((e.shape.ratio, e.jct_s) for e in everything if e.mode == mode)
        ax.plot([x for x, _ in pts], [y for _, y in pts], "--", color=f"C{i}", alpha=0.6, label=f"{mode}: estimate")
        sims = sorted((c.estimate.shape.ratio, c.predicted["jct_s"]) for c in plan.ranked if c.estimate.mode == mode)
        if sims:
            ax.plot([x for x, _ in sims], [y for _, y in sims], "o", color=f"C{i}", label=f"{mode}: simulated")
        cut = sorted((o.estimate.shape.ratio, o.jct_above_s) for o in plan.outranked if o.estimate.mode == mode)
        if cut:  # stopped at their bound: the JCT is above the mark
            ax.plot([x for x, _ in cut], [y for _, y in cut], "^", color=f"C{i}", fillstyle="none",
                    label=f"{mode}: stopped, JCT above")
    if plan.ranked:
        best = plan.ranked[0]
        ax.annotate(f"first: {best.estimate.shape.pd} {best.estimate.mode}",
                    (best.estimate.shape.ratio, best.predicted["jct_s"]), textcoords="offset points", xytext=(8, 8),
                    fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("P/D (prefill nodes / decode nodes)")
    ax.set_ylabel("JCT s")
    req = plan.request
    ax.set_title(f"dualpath plan: {req.model}, {req.gpus} GPUs, {plan.demand.num_agents} agents, "
                 f"MaxLen {format_tokens(req.workload.max_len_tokens)}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
