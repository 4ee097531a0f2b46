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
# the acceptance's examples: each JSON and the command that wrote it (its PNG beside it)
EXAMPLES = {
    "plan/ds660b_128gpu_64k_4096.json": "dualpath plan --model ds-v3.2-660b --gpus 128 --max-len 64k --agents 4096",
    "plan/ds27b_128gpu_64k_4096.json": "dualpath plan --model ds-27b --gpus 128 --max-len 64k --agents 4096",
    "plan/ds660b_128gpu_mooncake.json": ("dualpath plan --model ds-v3.2-660b --gpus 128 "
                                         "--trace src/dualpath/workloads/data/mooncake_conversation_slice.jsonl"),
}
EXAMPLE_FLAGS = "--slo-ttft-p99 4 --slo-tpot 0.05"
SHOWN = 10  # ranked configurations shown per example (the JSON holds them all)
EXAMPLE_COMMAND = (f"COMMAND {EXAMPLE_FLAGS} --json docs/results/F.json --plot docs/results/F.png (COMMAND and F per "
                   f"example above)")

@block("plan_check", reads=(CHECK_JSON,), command=CHECK_COMMAND)
def plan_check(r: Results) -> str:
    d = r.json(CHECK_JSON)
    rows = [_row(c) for c in d["cases"]]
    units = [abs(u["jct_s_error"]) for c in d["cases"] for u in c["unit_vs_whole"] if u["jct_s_error"] is not None]
    ttft_units = [abs(u[k]) for c in d["cases"] for u in c["unit_vs_whole"] for k in ("ttft_p50_s_error", "ttft_p99_s_error")
                  if u[k] is not None]
    workers = d.get("workers", 1)
    text = (f"Simulator code `{d['simulator_code']}`; the planner ran as `dualpath plan` runs it, its simulations in "
            f"{workers} process{'es' if workers > 1 else ''} of this machine. Goals: regret at most {pct(REGRET_GOAL, 0, False)}; the first "
            f"choice's predicted JCT within {pct(JCT_GOAL, 0, False)} and TTFT p50 / p99 within "
            f"{pct(TTFT_GOAL, 0, False)} of the same configuration simulated whole; the plan in under "
            f"{num(PLAN_TIME_GOAL_S)} s. Regret met on **{sum(c['regret'] <= REGRET_GOAL for c in d['cases'])} of "
            f"{len(d['cases'])}** cases.")
    if units:
        text += (f" Simulating a shape at its unit instead of whole, over every shape of the offline cases that has a "
                 f"smaller unit ({len(units)} runs): |JCT error| at most {pct(max(units), 1, False)}, median "
                 f"{pct(sorted(units)[len(units) // 2], 1, False)}; |TTFT p50 / p99 error| at most "
                 f"{pct(max(ttft_units), 0, False)}.")
    at_unit = sum(any((u["pd"], u["mode"]) == (c["planner"]["first"]["pd"], c["planner"]["first"]["mode"])
                      for u in c["unit_vs_whole"]) for c in d["cases"])
    text += (f" First choices predicted from a smaller unit: {at_unit} of {len(d['cases'])} (the others are their own "
             f"unit, so their prediction is their whole simulation).")
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


@block("plan_example", reads=tuple(EXAMPLES), command=EXAMPLE_COMMAND)
def plan_example(r: Results) -> str:
    return "\n\n".join(_example(r.json(rel), rel, command) for rel, command in EXAMPLES.items())


def _example(d: Node, rel: str, command: str) -> str:
    req = d["request"]
    rows = [[str(i), c["pd"], c["mode"], f"{c['unit_pd']} x{c['copies']}", sig(c["predicted"]["jct_s"]),
             sig(c["predicted"]["ttft_p50_s"]), sig(c["predicted"]["ttft_p99_s"]), num(c["predicted"]["tpot_s"] * 1e3, 1),
             "met" if c["meets_slo"] else "missed", c["binding"]] for i, c in enumerate(d["ranked"][:SHOWN], 1)]
    best = d["ranked"][0]
    wl = req["workload"]
    what = (f"{num(d['demand']['agents'])} agents ({num(d['demand']['turns'])} turns)" if wl["kind"] == "generated"
            else f"a Mooncake trace ({num(d['demand']['turns'])} requests in {num(d['demand']['agents'])} conversations)")
    text = (f"`{command} {EXAMPLE_FLAGS}` (`{rel.removeprefix('plan/').removesuffix('.json')}`): {req['model']}, "
            f"{req['gpus']} GPUs, {what}, objective {req['objective']}: "
            f"{len(d['ranked']) + len(d.get('outranked', []))} configurations simulated"
            f"{_stopped(d)}, {len(d['unconfirmed'])} estimated only, {len(d['pruned'])} "
            f"outside the bottleneck-free range, in **{sig(d['wall_s'])} s** on this machine "
            f"({d.get('build', 'pure')} simulator{_machine(d)}; {met(d['wall_s'] < PLAN_TIME_GOAL_S)} against "
            f"{num(PLAN_TIME_GOAL_S)} s). "
            f"{'Some' if d['any_meets_slo'] else 'No'} simulated configuration meets the SLOs. First choice: "
            f"`{best['commands']['sim']}`." + (f" The first {SHOWN}:" if len(d["ranked"]) > SHOWN else ""))
    header = ["#", "P/D", "mode", "simulated as", "JCT s", "TTFT p50 s", "TTFT p99 s", "TPOT ms", "SLO", "binding"]
    return text + "\n\n" + table(header, rows)


def _machine(d: Node) -> str:
    """The machine's speed around the plan (`dualpath bench sim-speed`'s heap task), where recorded."""
    speed = d.get("machine_heap_ops_per_s")
    if speed is None:
        return ""
    return (f"; the machine at {sig(speed['before'] / 1e6)} and {sig(speed['after'] / 1e6)} M heap operations/s "
            f"before and after, `dualpath bench sim-speed`'s measure")


def _stopped(d: Node) -> str:
    """How many simulations stopped at their bound (plan/search.py step 5), and that they are not ranked."""
    n = len(d.get("outranked", []))
    return f" ({n} stopped once they could not come first, not ranked)" if n else ""


LOCAL_JSON = "plan/local_ranking.json"
LOCAL_COMMAND = ("dualpath bench plan-local --repeat 2 --json docs/results/plan/local_ranking.json "
                 "--plot docs/results/plan/local_ranking.png")


@block("plan_local", reads=(LOCAL_JSON,), command=LOCAL_COMMAND)
def plan_local(r: Results) -> str:
    d = r.json(LOCAL_JSON)
    planner_rank = {f"{c['pd']} {c['mode']}": i for i, c in enumerate(d["ranked"], 1)}
    rows = sorted(d["rows"], key=lambda x: x["runtime_mean_s"])
    table_rows = [[str(i), str(planner_rank[f"{x['pd']} {x['mode']}"]), x["pd"], x["mode"], sig(x["predicted_jct_s"]),
                   f"{sig(x['runtime_mean_s'])} ({', '.join(sig(v) for v in x['runtime_jct_s'])})", pct(x["error"])]
                  for i, x in enumerate(rows, 1)]
    digests = [v for _, v in d["tokens_sha256"].items()]  # per configuration, one per round (each round its own prompts)
    same_tokens = all(len({v[i] for v in digests}) == 1 for i in range(d["repeat"]))
    text = (f"{d['model']} on {d['cpus']} CPUs, every shape of at most {d['engines']} engines, "
            f"{d['workload']['agents']} agents x {d['workload']['rounds']} rounds at SNIC "
            f"{num(d['rates']['snic_bytes_per_s'] / 1e6, 1)} MB/s per node; the planner's {len(d['ranked'])} simulations took {sig(d['plan_wall_s'])} s, "
            f"the runtime {sig(d['runtime_wall_s'])} s ({d['repeat']} runs per configuration). 1P1D against each other "
            f"shape in the same mode: **{d['one_p_one_d_agree']} of {d['one_p_one_d_pairs']}** verdicts agree. Every "
            f"pair: {d['agree']} of {len(d['pairs'])} agree, **{d['contradictions']}** ordered against the runtime "
            f"(a tie: within {pct(d['tie_fraction'], 0, False)}, or runs' ranges that overlap). |JCT error| at most "
            f"{pct(d['max_abs_error'], 1, False)}. Generated tokens identical across shapes and modes, round by round: "
            f"{'yes' if same_tokens else '**no**'}.")
    header = ["runtime rank", "planner rank", "P/D", "mode", "predicted JCT s", "runtime JCT s (runs)", "error"]
    return text + "\n\n" + table(header, table_rows)
