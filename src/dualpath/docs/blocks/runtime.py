"""The runtime on one host: the demo, the demo beside CPU hogs, the cold workload, the CUDA check,
and the simulator's fidelity to the runtime."""

from __future__ import annotations

from ..fmt import mb, met, ms, num, pct, ratio, table
from ..registry import block
from ..results import Node, Results

FIDELITY_RUNS = tuple(f"fidelity/{w}_s27.json" for w in ("demo", "agents", "mooncake"))
METRIC_LABELS = {"jct_s": "JCT", "ttft_p50_s": "TTFT p50", "tpot_mean_s": "TPOT", "pe_path_bytes": "bytes PE path",
                 "de_path_bytes": "bytes DE path"}


def _plan(r: Node) -> str:
    """The rates the demo derived (or was given) and the workload they were sized for."""
    rates, w = r["config"]["rates"], r["workload"]
    return (f"SNIC {mb(rates['snic_bytes_per_s'])} MB/s per node, CNIC {mb(rates['cnic_bytes_per_s'])} MB/s "
            f"({rates['source']}: a turn's hit loads through one SNIC in {rates['load_over_compute']:g}x its prefill "
            f"compute; basic's JCT predicted at {num(rates['predicted_basic_jct_s'], 1)} s); {w['num_agents']} agents x "
            f"{w['rounds']} rounds ({w['num_turns']} turns)")


def _by_mode(r: Node) -> dict[str, Node]:
    return {run["mode"]: run for run in r["runs"]}


def jct_ratio(r: Node) -> float:
    runs = _by_mode(r)
    return runs["dualpath"]["jct_s"] / runs["basic"]["jct_s"]


def _snic_util(run: Node, node: str) -> str:
    u = run["snic"][node]["utilisation"]
    return "-" if u is None else ratio(u)


@block("demo", reads=("runtime/demo.json",),
       command="dualpath demo --json docs/results/runtime/demo.json --plot docs/results/runtime/demo.png")
def demo(r: Results) -> str:
    d = r.json("runtime/demo.json")
    rows = [[m["mode"], num(m["jct_s"], 1), num(m["ttft_s"]["p50"], 2), num(m["ttft_s"]["p90"], 2), ms(m["tpot_s"]["mean"], 0),
             pct(m["cached_tokens"] / m["prompt_tokens"], 1, False), mb(m["bytes"]["storage_to_prefill"], 0),
             mb(m["bytes"]["storage_via_decode"], 0), _snic_util(m, "0"), _snic_util(m, "1"),
             f"{m['pe_busy_s_per_turn']:.3f}"] for m in d["runs"]]
    return (f"Plan: {_plan(d)}.\n\n"
            + table(["mode", "JCT s", "TTFT p50 s", "TTFT p90 s", "TPOT ms", "hit", "PE-path MB", "DE-path MB",
                     "SNIC util PE node", "SNIC util DE node", "PE busy s per turn"], rows)
            + f"\n\n**JCT dualpath / basic = {ratio(jct_ratio(d))}.**")


@block("demo_robustness", reads=("runtime/demo_robustness.json",),
       command="dualpath bench demo-robustness --json docs/results/runtime/demo_robustness.json "
               "--plot docs/results/runtime/demo_robustness.png")
def demo_robustness(r: Results) -> str:
    d = r.json("runtime/demo_robustness.json")
    rows = []
    for run in d["runs"]:
        util, busy = run["snic_util_while_reading_dualpath"], run["pe_busy_s_per_turn"]
        rows.append([run["hogs"], num(run["jct_basic_s"], 1), num(run["jct_dualpath_s"], 1), f"**{ratio(run['ratio'])}**",
                     f"{ratio(util['0'])}, {ratio(util['1'])}",
                     f"{busy['basic']:.3f} / {busy['dualpath']:.3f} ({pct(run['pe_busy_dualpath_over_basic'] - 1, 0)})"])
    return (f"Plan (computed once, for every row): {_plan(d)}.\n\n"
            + table(["CPU hogs", "JCT basic s", "JCT dualpath s", "dualpath / basic",
                     "SNIC util while reading, PE node, DE node (dualpath)", "PE busy s per turn, basic / dualpath"], rows))


@block("demo_cold", reads=("runtime/demo_cold.json",), command="dualpath bench cold --json docs/results/runtime/demo_cold.json")
def demo_cold(r: Results) -> str:
    d = r.json("runtime/demo_cold.json")
    rows = [[m["mode"], num(m["jct_s"], 1), num(m["ttft_s"]["p50"], 2), num(m["ttft_s"]["p90"], 2),
             f"{m['pe_busy_s_per_turn']:.3f}", pct(m["cached_tokens"] / m["prompt_tokens"], 1, False),
             mb(m["bytes"]["cnic_lane_kv"], 0)] for m in d["runs"]]
    w = d["workload"]
    return (f"{w['num_agents']} agents x {w['rounds']} turns of fresh {w['first_prompt_tokens']}-token prompts, "
            f"{w['gen_tokens']} tokens generated each.\n\n"
            + table(["mode", "JCT s", "TTFT p50 s", "TTFT p90 s", "PE busy s per turn", "hit", "CNIC KV MB"], rows)
            + f"\n\n**JCT dualpath / basic = {ratio(jct_ratio(d))}.**")


@block("cuda_check", reads=("runtime/cuda_check.json",),
       command="PYTHONPATH=src python3 tools/cuda_check.py --json docs/results/runtime/cuda_check.json")
def cuda_check(r: Results) -> str:
    d = r.json("runtime/cuda_check.json")
    c = d["checks"]
    greedy, layerwise, trip = (c["greedy_tokens_cpu_eq_cuda"], c["layerwise_from_pinned_bytes_eq_recompute"],
                               c["pinned_round_trip_bit_exact"])
    rows = [["greedy tokens, CPU against CUDA", f"{sum(bool(p) for p in greedy['per_prompt'])} of "
             f"{len(greedy['per_prompt'])} prompts identical", met(greedy["ok"])],
            ["layerwise prefill from pinned host bytes against recompute, on CUDA",
             f"max logit error {layerwise['max_logit_err']:.1e}, max KV error {layerwise['max_kv_err']:.1e}",
             met(layerwise["ok"])],
            ["one layer's KV, GPU -> pinned host bytes -> GPU", f"{num(trip['bytes'])} B, bit-exact", met(trip["ok"])]]
    return f"On {d['device']}, PyTorch {d['torch']}:\n\n" + table(["check", "result", "passed"], rows)


def _err(metric: Node) -> str:
    """A fidelity error with its goal's verdict where the metric has one."""
    cell = pct(metric["rel_error"])
    return cell + (": **missed**" if "goal" in metric and not metric["met"] else "")


def _sides(mode: Node) -> str:
    d = mode["decisions"]
    repeats = [x["same_side"] for x in d["runtime_repeats"]]
    own = f" (runtime repeats {pct(min(repeats), 0, False)})" if repeats else ""
    return pct(d["same_side_mean"], 0, False) + ("" if d["side_met"] else ": **missed**") + own


def _spread(mode: Node, repeat: int) -> str:
    if repeat < 2:
        return "- (one run)"
    m = mode["metrics"]
    return pct(max(m[k]["runtime_spread"] for k in ("jct_s", "ttft_p50_s", "tpot_mean_s")), 1, False)


@block("fidelity", reads=FIDELITY_RUNS,
       command="dualpath fidelity --workload W --repeat 2 (agents: 1) --json docs/results/fidelity/W_s27.json "
               "--plot docs/results/fidelity/W_s27.png")
def fidelity(r: Results) -> str:
    rows, missed, num_goals = [], [], 0
    for rel in FIDELITY_RUNS:
        f = r.json(rel)
        for name, mode in f["modes"].items():
            m = mode["metrics"]
            goals = [(k, x) for k, x in m.items() if "goal" in x] + [("same read side", mode["decisions"])]
            num_goals += len(goals)
            missed += [f"{f['workload']} {name} {METRIC_LABELS.get(k, k)}" for k, x in goals
                       if not x.get("met", x.get("side_met"))]
            rows.append([f"{f['workload']}, {name}", _err(m["jct_s"]), _err(m["ttft_p50_s"]), _err(m["ttft_p90_s"]),
                         _err(m["ttst_mean_s"]), _err(m["tpot_mean_s"]),
                         f"{_err(m['pe_path_bytes'])} / {_err(m['de_path_bytes'])}", _sides(mode), _spread(mode, f["repeat"])])
    first = r.json(FIDELITY_RUNS[0])["modes"]
    mode = first[next(iter(first))]
    goals = ", ".join(f"{METRIC_LABELS.get(name, name)} {pct(m['goal'], 0, False)}"
                      for name, m in mode["metrics"].items() if "goal" in m)
    return (f"Goals: {goals}, same read side {pct(mode['decisions']['side_goal'], 0, False)}.\n\n"
            + table(["workload, mode", "JCT", "TTFT p50", "TTFT p90", "TTST", "TPOT", "bytes PE / DE path",
                     "same read side", "runtime spread"], rows)
            + f"\n\n{num_goals - len(missed)} of {num_goals} goals met" + (f"; missed: {', '.join(missed)}." if missed else "."))
