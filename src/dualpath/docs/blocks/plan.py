"""`dualpath plan`: its check against every configuration simulated whole (bench/plan_check.py),
and the issue's example plans, from their JSONs."""

from __future__ import annotations

from ..fmt import met, num, pct, sig, table
from ..registry import block
from ..results import Node, Results

CHECK_JSON = "plan/bench_plan.json"
CHECK_COMMAND = ("dualpath bench plan --out out/plan --json docs/results/plan/bench_plan.json "
                 "--plot docs/results/plan/bench_plan.png")
# Goals (the planner's issue): regret at most 5% on the objective; the first choice's predicted JCT
# within 5% and TTFT p50 / p99 within 10% of its full-scale simulation; a plan in under 60 s here.
REGRET_GOAL = 0.05
JCT_GOAL = 0.05
TTFT_GOAL = 0.10
PLAN_TIME_GOAL_S = 60.0
EXAMPLES = ("plan/ds660b_128gpu_64k_4096.json",)
EXAMPLE_COMMAND = ("dualpath plan --model ds-v3.2-660b --gpus 128 --max-len 64k --agents 4096 --slo-ttft-p99 4 "
                   "--slo-tpot 0.05 --json docs/results/plan/ds660b_128gpu_64k_4096.json "
                   "--plot docs/results/plan/ds660b_128gpu_64k_4096.png")


@block("plan_check", reads=(CHECK_JSON,), command=CHECK_COMMAND)
def plan_check(r: Results) -> str:
    d = r.json(CHECK_JSON)
    rows = [_row(c) for c in d["cases"]]
    units = [abs(u["jct_s_error"]) for c in d["cases"] for u in c["unit_vs_whole"] if u["jct_s_error"] is not None]
    ttft_units = [abs(u[k]) for c in d["cases"] for u in c["unit_vs_whole"] for k in ("ttft_p50_s_error", "ttft_p99_s_error")
                  if u[k] is not None]
    text = (f"Simulator code `{d['simulator_code']}`. Goals: regret at most {pct(REGRET_GOAL, 0, False)}; the first "
            f"choice's predicted JCT within {pct(JCT_GOAL, 0, False)} and TTFT p50 / p99 within "
            f"{pct(TTFT_GOAL, 0, False)} of the same configuration simulated whole; the plan in under "
            f"{num(PLAN_TIME_GOAL_S)} s. Regret met on **{sum(c['regret'] <= REGRET_GOAL for c in d['cases'])} of "
            f"{len(d['cases'])}** cases.")
    if units:
        text += (f" Simulating a shape at its unit instead of whole, over every shape of the offline cases that has a "
                 f"smaller unit ({len(units)} runs): |JCT error| at most {pct(max(units), 1, False)}, median "
                 f"{pct(sorted(units)[len(units) // 2], 1, False)}; |TTFT p50 / p99 error| at most "
                 f"{pct(max(ttft_units), 0, False)}.")
    header = ["case", "first choice", "exhaustive best", "regret", "JCT error", "TTFT p50 error", "TTFT p99 error",
              "simulated", "plan s"]
    return text + "\n\n" + table(header, rows)


def _row(c: Node) -> list[str]:
    e, p = c["prediction_error"], c["planner"]
    first, best = p["first"], c["best"]

    def err(x: float | None, goal: float) -> str:
        return "-" if x is None else (pct(x) if abs(x) <= goal else f"**{pct(x)}**")

    return [c["name"], f"{first['pd']} {first['mode']}", f"{best['pd']} {best['mode']}",
            f"{pct(c['regret'], 1, False)} ({met(c['regret'] <= REGRET_GOAL)})", err(e["jct_s"], JCT_GOAL),
            err(e["ttft_p50_s"], TTFT_GOAL), err(e["ttft_p99_s"], TTFT_GOAL),
            f"{p['simulated']} of {p['simulated'] + p['estimated_only']} (+{p['pruned']} pruned)",
            f"{sig(p['wall_s'])} ({met(p['wall_s'] < PLAN_TIME_GOAL_S)})"]


@block("plan_example", reads=EXAMPLES, command=EXAMPLE_COMMAND)
def plan_example(r: Results) -> str:
    d = r.json(EXAMPLES[0])
    req = d["request"]
    rows = [[str(i), c["pd"], c["mode"], f"{c['unit_pd']} x{c['copies']}", sig(c["predicted"]["jct_s"]),
             sig(c["predicted"]["ttft_p50_s"]), sig(c["predicted"]["ttft_p99_s"]), num(c["predicted"]["tpot_s"] * 1e3, 1),
             "met" if c["meets_slo"] else "missed", c["binding"]] for i, c in enumerate(d["ranked"], 1)]
    best = d["ranked"][0]
    text = (f"{req['model']}, {req['gpus']} GPUs, {num(d['demand']['agents'])} agents "
            f"({num(d['demand']['turns'])} turns), objective {req['objective']}: {len(d['ranked'])} configurations "
            f"simulated, {len(d['unconfirmed'])} estimated only, {len(d['pruned'])} outside the bottleneck-free range, "
            f"in **{sig(d['wall_s'])} s** on this machine ({met(d['wall_s'] < PLAN_TIME_GOAL_S)} against "
            f"{num(PLAN_TIME_GOAL_S)} s). {'Some' if d['any_meets_slo'] else 'No'} simulated configuration meets the "
            f"SLOs. First choice: `{best['commands']['sim']}`.")
    header = ["#", "P/D", "mode", "simulated as", "JCT s", "TTFT p50 s", "TTFT p99 s", "TPOT ms", "SLO", "binding"]
    return text + "\n\n" + table(header, rows)
