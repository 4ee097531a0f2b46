"""`dualpath bench plan-local`: does `dualpath plan --local` rank the local cluster's shapes as the
runtime's measured JCT does?

1. The workload and rates as the demo plans them on this machine now (runtime/apps/demo.py:
   plan_demo, the profile timed again at start), shared by both worlds.
2. The planner (plan/local.py), timed: every shape of at most `engines` engines and every mode,
   simulated whole with the `local` preset.
3. The runtime: `repeat` rounds; in each, every shape in turn on a fresh cluster running every mode
   (a fresh store each), so a drift of the machine's speed spreads over all shapes alike.
4. The comparison: per configuration the runtime's mean JCT, its runs' range and the prediction's
   error; per pair of configurations each world's verdict (`order`: a JCT more than TIE_FRACTION
   shorter than the other's, for the runtime also outside the other's runs' range; else a tie);
   the pairs the acceptance names (1P1D against each other shape, in the same mode) and every
   pair the planner orders against the runtime (`contradictions`).
"""

from __future__ import annotations

import asyncio
import time
from itertools import combinations
from pathlib import Path
from typing import Any, Callable, Sequence

TIE_FRACTION = 0.05  # two JCTs within 5% are a tie in either world: the planner's JCT tolerance (issue acceptance)


def order(a: float, b: float, spread_a: tuple[float, float] | None = None,
          spread_b: tuple[float, float] | None = None) -> str:
    """'<' when a is shorter than b by more than TIE_FRACTION (of the shorter), '>' the other way,
    '=' otherwise; with runs' ranges (lo, hi), also '=' when the two ranges overlap."""
    gap = (b - a) / min(a, b)
    if abs(gap) <= TIE_FRACTION:
        return "="
    if spread_a is not None and spread_b is not None and spread_a[0] <= spread_b[1] and spread_b[0] <= spread_a[1]:
        return "="
    return "<" if gap > 0 else ">"


def compare(predicted: Sequence[dict[str, Any]], runtime: dict[str, list[float]]) -> dict[str, Any]:
    """`predicted`: plan/local.py rows; `runtime`: per key `pd mode`, the JCTs of its runs."""
    rows = []
    for c in predicted:
        runs = runtime[f"{c['pd']} {c['mode']}"]
        mean = sum(runs) / len(runs)
        rows.append({"pd": c["pd"], "mode": c["mode"], "predicted_jct_s": c["predicted"]["jct_s"], "runtime_jct_s": runs,
                     "runtime_mean_s": mean, "error": (c["predicted"]["jct_s"] - mean) / mean})
    pairs = []
    for a, b in combinations(rows, 2):
        sim = order(a["predicted_jct_s"], b["predicted_jct_s"])
        real = order(a["runtime_mean_s"], b["runtime_mean_s"], _range(a), _range(b))
        pairs.append({"a": f"{a['pd']} {a['mode']}", "b": f"{b['pd']} {b['mode']}", "planner": sim, "runtime": real,
                      "agree": sim == real, "contradiction": {sim, real} == {"<", ">"},
                      "one_p_one_d": a["mode"] == b["mode"] and "1P1D" in (a["pd"], b["pd"])})
    named = [p for p in pairs if p["one_p_one_d"]]
    by_runtime = sorted(rows, key=lambda r: r["runtime_mean_s"])
    return {"rows": rows, "pairs": pairs, "tie_fraction": TIE_FRACTION,
            "one_p_one_d_agree": sum(p["agree"] for p in named), "one_p_one_d_pairs": len(named),
            "agree": sum(p["agree"] for p in pairs), "contradictions": sum(p["contradiction"] for p in pairs),
            "runtime_best": f"{by_runtime[0]['pd']} {by_runtime[0]['mode']}",
            "max_abs_error": max(abs(r["error"]) for r in rows)}


def _range(row: dict[str, Any]) -> tuple[float, float]:
    return min(row["runtime_jct_s"]), max(row["runtime_jct_s"])


def check(model: str, engines: int, modes: Sequence[str], repeat: int, device: str = "cpu",
          progress: Callable[[str], None] = print) -> dict[str, Any]:
    """The whole bench (module docstring): planner, runtime runs, comparison."""
    from ..plan.local import LocalWorkload, available_cpus, local_shapes, plan_local

    shapes = local_shapes(engines)
    work = LocalWorkload.of_demo(model, device)
    cal = work.plan.calibration
    cpus = available_cpus()
    t0 = time.perf_counter()
    ranked = plan_local(work, engines, modes, cpus)
    plan_wall_s = time.perf_counter() - t0
    progress(f"planner: {plan_wall_s:.1f} s; first choice {ranked[0]['pd']} {ranked[0]['mode']}")
    runtime, tokens, walls = asyncio.run(_runtime(work, shapes, modes, repeat, device, progress))
    return {"model": model, "device": device, "engines": engines, "cpus": cpus, "modes": list(modes), "repeat": repeat,
            "rates": work.rates.to_json(), "workload": {"agents": len(work.plan.trajectories),
                                                         "rounds": len(work.plan.trajectories[0].turns)},
            "profile": None if cal.path is None else str(cal.path), "plan_wall_s": plan_wall_s, "runtime_wall_s": walls,
            "ranked": ranked, "runtime": runtime, "tokens_sha256": tokens, **compare(ranked, runtime)}


async def _runtime(work: Any, shapes: Sequence[tuple[int, int]], modes: Sequence[str], repeat: int, device: str,
                   progress: Callable[[str], None]) -> tuple[dict[str, list[float]], dict[str, list[str]], float]:
    """Per `pd mode`, the JCT of each round's run, and its generated tokens' digests (every shape
    and mode must produce the same tokens)."""
    from ..runtime.apps.demo import run_demo

    jct: dict[str, list[float]] = {}
    tokens: dict[str, list[str]] = {}
    t0 = time.perf_counter()
    for i in range(repeat):
        for pd in shapes:
            res = await run_demo(tuple(modes), model=work.model, device=device, plan=work.plan, seed=i, pd=pd)
            for run in res["runs"]:
                key = f"{pd[0]}P{pd[1]}D {run['mode']}"
                jct.setdefault(key, []).append(run["jct_s"])
                tokens.setdefault(key, []).append(run["tokens_sha256"])
            progress(f"round {i + 1}/{repeat} {pd[0]}P{pd[1]}D: "
                     + ", ".join(f"{r['mode']} {r['jct_s']:.1f} s" for r in res["runs"]))
    return jct, tokens, time.perf_counter() - t0


def plot(report: dict[str, Any], path: Path) -> Path:
    """Per configuration the predicted JCT beside the runtime's runs (mean, range), runtime order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted(report["rows"], key=lambda r: r["runtime_mean_s"])
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 2, 3.6))
    means = [r["runtime_mean_s"] for r in rows]
    lo = [m - min(r["runtime_jct_s"]) for m, r in zip(means, rows)]
    hi = [max(r["runtime_jct_s"]) - m for m, r in zip(means, rows)]
    ax.bar([i - 0.2 for i in x], means, 0.4, yerr=[lo, hi], capsize=3, label=f"runtime (mean, range of {report['repeat']})")
    ax.bar([i + 0.2 for i in x], [r["predicted_jct_s"] for r in rows], 0.4, label="plan --local (predicted)")
    ax.set_xticks(list(x), [f"{r['pd']}\n{r['mode']}" for r in rows], fontsize=8)
    ax.set_ylabel("JCT s")
    ax.set_title(f"local shapes, {report['model']} on {report['cpus']} CPUs: 1P1D pairs agree "
                 f"{report['one_p_one_d_agree']}/{report['one_p_one_d_pairs']}, contradictions {report['contradictions']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
