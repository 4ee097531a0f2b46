"""The runtime on one host: the demo, the demo beside CPU hogs, the cold workload, the CUDA check,
and the simulator's fidelity to the runtime."""

from __future__ import annotations

from ..fmt import mb, met, ms, num, pct, ratio, table
from ..registry import block
from ..results import Node, Results

# held-out workloads: no part of the `local` preset was developed on them (docs/results.md, fidelity);
# the agents workload's first run and its rerun (the same command, no code changed between them)
FIDELITY_RUNS = {"fidelity/heldout_agents_24k.json": "", "fidelity/heldout_mooncake_1000s.json": "",
                 "fidelity/heldout_mooncake_450s.json": "",
                 "fidelity/heldout_agents_24k_split.json": "", "fidelity/heldout_agents_64k_selective.json": "",
                 "fidelity/heldout_agents_24k_dram.json": ""}


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
    return f"Plan: {_plan(d)}.\n\n" + _demo_table(d) + f"\n\n**JCT dualpath / basic = {ratio(jct_ratio(d))}.**"


@block("demo_modes", reads=("runtime/demo_modes.json",),
       command="dualpath demo --modes basic,dualpath,dualpath+split,selective,dualpath+selective,basic+dram,dualpath+dram "
               "--json docs/results/runtime/demo_modes.json --plot docs/results/runtime/demo_modes.png")
def demo_modes(r: Results) -> str:
    d = r.json("runtime/demo_modes.json")
    basic = _by_mode(d)["basic"]
    rows = [[m["mode"], f"**{ratio(m['jct_s'] / basic['jct_s'])}**", m["tokens_sha256"][:16],
             "yes" if m["tokens_sha256"] == basic["tokens_sha256"] else "**NO**"] for m in d["runs"]]
    return (f"Plan: {_plan(d)}.\n\n" + _demo_table(d) + "\n\n"
            + table(["mode", "JCT / basic (one run, one cluster)", "tokens_sha256", "basic's tokens"], rows))


def _demo_table(d: Node) -> str:
    """One row per mode; a DRAM column when a mode has a tier (`+dram`: bytes its reads took from it)."""
    dram = any(e.get("dram_read_bytes") for m in d["runs"] for _, e in m["snic"].items())
    rows = [[m["mode"], num(m["jct_s"], 1), num(m["ttft_s"]["p50"], 2), num(m["ttft_s"]["p90"], 2), ms(m["tpot_s"]["mean"], 0),
             pct(m["cached_tokens"] / m["prompt_tokens"], 1, False), mb(m["bytes"]["storage_to_prefill"], 0),
             mb(m["bytes"]["storage_via_decode"], 0),
             *([mb(sum(e.get("dram_read_bytes", 0) for _, e in m["snic"].items()), 0)] if dram else []),
             _snic_util(m, "0"), _snic_util(m, "1"), f"{m['pe_busy_s_per_turn']:.3f}"] for m in d["runs"]]
    return table(["mode", "JCT s", "TTFT p50 s", "TTFT p90 s", "TPOT ms", "hit", "PE-path MB", "DE-path MB",
                  *(["DRAM-tier MB"] if dram else []), "SNIC util PE node", "SNIC util DE node", "PE busy s per turn"], rows)


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


# ours over transformers, speed: the goal for prefill and decode (project choice: the engine is to be
# faster than the library it replaces by a margin the machine's noise does not erase)
MODEL_SPEED_GOAL = 1.2
_MODEL_SPEED_LABELS = {
    ("ours_prefill", "transformers_prefill"): "prefill, over transformers' forward (logits of every position)",
    ("ours_prefill", "transformers_prefill_last_logits"): "prefill, over transformers as its `generate` runs it (last position's logits)",
    ("ours_decode", "transformers_decode"): "decode, workspace (the default), over transformers' dense cache",
    ("ours_gather_decode", "transformers_decode"): "decode, every block gathered each step, over transformers' dense cache",
}


@block("model_speed", reads=("runtime/model_speed.json",),
       command="dualpath bench model-speed --profile --json docs/results/runtime/model_speed.json "
               "--plot docs/results/runtime/model_speed.png")
def model_speed(r: Results) -> str:
    d = r.json("runtime/model_speed.json")
    rows = [[_MODEL_SPEED_LABELS[(c["ours"], c["theirs"])], f"**{ratio(c['median'])}**", f"{ratio(c['min'])}-{ratio(c['max'])}",
             "" if c["ours"] == "ours_gather_decode" else met(c["median"] >= MODEL_SPEED_GOAL)]
            for c in d["summary"]["ratios"]]
    rates = d["summary"]["tokens_per_s"]
    prof = d["profile"]

    def top(run: str) -> str:
        return ", ".join(f"`{o['op'].removeprefix('aten::')}` {ms(o['ms'] / 1e3)} ms ({pct(o['share'], 0, signed=False)})" for o in prof[run][:3])

    return (f"{d['model']}, fp32, {d['threads']} torch thread, a {num(d['prompt_tokens'])}-token prompt; decode: "
            f"{d['decode_batch']} sequences of that prompt, {d['decode_tokens']} steps; {d['repeats']} paired repeats "
            f"(torch {d['torch']}, transformers {d['transformers']}). Tokens/s, medians: ours prefill "
            f"{num(rates['ours_prefill'])}, transformers {num(rates['transformers_prefill'])} (last-position logits: "
            f"{num(rates['transformers_prefill_last_logits'])}); ours decode {num(rates['ours_decode'], 1)} (gathering: "
            f"{num(rates['ours_gather_decode'], 1)}), transformers {num(rates['transformers_decode'], 1)}.\n\n"
            + table(["ours / transformers, speed", "median", "min-max", f"goal >= {MODEL_SPEED_GOAL:g}"], rows)
            + f"\n\nWhere the time goes (`--profile`, self CPU time): prefill {top('prefill')}; a decode step "
              f"{top('decode_step')}; gathering instead, {top('gather_decode_step')}. The prefill's GEMMs ran at "
              f"{num(d['prefill_gemm_gflop_per_s'])} GFLOP/s, one plain GEMM of the MLP's shape at "
              f"{num(d['plain_gemm_gflop_per_s'])} GFLOP/s on the same thread.")


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


GOAL_LABELS = {"jct_s": "JCT", "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "tpot_mean_s": "TPOT"}
HOLDS = ("met", "within noise")  # fidelity/compare.py: the verdicts under which a goal holds


def _cell(errs: Node, stats: Node, name: str) -> str:
    """The predicted error, its noise and verdict; the replayed error; the runtime runs' spread."""
    e = errs["predicted"][name]
    verdict = e["verdict"] if e["verdict"] in HOLDS else f"**{e['verdict']}**"
    noise = "?" if e["noise"] is None else pct(e["noise"], 1, False)  # null: one run, its noise unknown
    return (f"{pct(e['rel_error'])} ± {noise} {verdict} (replayed "
            f"{pct(errs['replayed'][name]['rel_error'])}; runs' spread {pct(stats[name]['spread'], 1, False)})")


def _drifts(drift: list) -> str:
    """Drifts (the profile's points timed again, now over then; a run's at its middle between the
    checks before and after its cluster), once per distinct value; per role (prefill / decode)
    where the checks timed both."""
    text = [f"{d:.2f}" if isinstance(d, (int, float)) else f"{d['prefill']:.2f}/{d['decode']:.2f}" for d in drift]
    return ", ".join(dict.fromkeys(text))


def _speeds(mode: Node) -> str:
    """The predicted SpeedModel (fidelity/speed.py): prefill scale + overhead; decode scale, copying KV, a join."""
    s = mode["speed"]["predicted"]
    return (f"x{s['prefill_scale']:.2f} + {1e3 * s['prefill_overhead_s']:.0f} ms; x{s['decode_scale']:.2f}, "
            f"x{1 + s['decode_io_slowdown']:.2f} copying KV, + {1e3 * s['decode_join_s']:.0f} ms a join")


@block("fidelity", reads=tuple(FIDELITY_RUNS),
       command=("dualpath fidelity --workload W --calibrate-on C [--calibrate-on C ...] --repeat R "
                "--json docs/results/fidelity/heldout_F.json --plot docs/results/fidelity/heldout_F.png "
                "(W, C, R and the modes per row below; F: agents_24k, mooncake_1000s, mooncake_450s, agents_24k_split, "
                "agents_64k_selective, agents_24k_dram)"))
def fidelity(r: Results) -> str:
    rows, held, unresolved, missed = [], 0, [], []
    for rel in FIDELITY_RUNS:
        f = r.json(rel)
        cal, label = f["calibration"], f" ({FIDELITY_RUNS[rel]})" if FIDELITY_RUNS[rel] else ""
        for name, mode in f["modes"].items():
            errs, stats = mode["errors"], mode["runtime"]
            for g in GOAL_LABELS:
                what = f"{_short(f['workload'])}{label} {name} {GOAL_LABELS[g]}"
                if errs["predicted"][g]["verdict"] in HOLDS:
                    held += 1
                elif errs["predicted"][g]["verdict"] == "noise exceeds goal":
                    unresolved.append(what)
                else:
                    missed.append(f"{what} (cause: {mode['causes'][g].split(':')[0]})")
            rows.append([f"`{f['workload']}`{label}, {name}",
                         ", ".join(cal["workloads"]) + f" (drift {_drifts(cal['drift'])}; scored runs "
                         f"{_drifts(f['drift_by_mode'][name])})",
                         f["repeat"],
                         *(_cell(errs, stats, g) for g in GOAL_LABELS),
                         f"{pct(errs['predicted']['pe_path_bytes']['rel_error'])} / "
                         f"{pct(errs['predicted']['de_path_bytes']['rel_error'])}", _speeds(mode)])
    total = held + len(unresolved) + len(missed)
    text = (f"{held} of {total} goals hold on the prediction"
            + (f"; not resolved (within the goal, but uncertain by more than it): "
               f"{'; '.join(unresolved)}" if unresolved else "")
            + (f"; missed: {'; '.join(missed)}." if missed else "."))
    return (table(["workload, mode", "calibrated on", "runs", *GOAL_LABELS.values(), "bytes PE / DE path",
                   "predicted speed: prefill; decode"], rows) + "\n\n" + text)


def _short(workload: str) -> str:
    """A workload's name in a list of goals; a trace slice with where it starts (`mooncake@1000s`)."""
    name, _, settings = workload.partition(":")
    start = dict(kv.split("=", 1) for kv in settings.split(",") if "=" in kv).get("start_s")
    return f"{name}@{start}s" if name == "mooncake" and start is not None else name


DRAM_COPY_RUNS = {
    "fidelity/dev_agents_24k_dram_model.json": "the router: an LRU model of the tiers, fed by the reads it sent",
    "fidelity/dev_agents_24k_dram_copy.json": "the router: a copy of the tiers from their reports (`DramChanged`)",
    "fidelity/dev_agents_24k_dram_64007.json": "the copy (held out then, before the next row's change)",
    "fidelity/dev_agents_24k_dram_fills.json": "the copy, and the simulator's DE tier takes each generated block as its step ends",
    "fidelity/heldout_agents_24k_dram.json": "both (the held-out run above)",
}


@block("fidelity_dram_copy", reads=tuple(DRAM_COPY_RUNS),
       command=("dualpath fidelity --workload agents:max_len=24k,agents=5,seed=57203,gen_scale=0.65,turns=5 "
                "--calibrate-on demo:rounds=0 --calibrate-on mooncake:start_s=0,conversations=3,load=1.0 "
                "--mode dualpath+dram --repeat 3 --json docs/results/fidelity/dev_agents_24k_dram_F.json "
                "(F: model, copy, fills, each at the code of its row; 64007: the seed in the workload, both dram "
                "modes, at the code of its row); the held-out row: the fidelity table's"))
def fidelity_dram_copy(r: Results) -> str:
    """dualpath+dram on the workload that showed the gap and the runs after it, each at the code of its
    row: how often the two worlds pick the same read side, and the errors."""
    rows = []
    for rel, what in DRAM_COPY_RUNS.items():
        mode = r.json(rel)["modes"]["dualpath+dram"]
        e = mode["errors"]["predicted"]
        rows.append([f"`{r.json(rel)['workload'].split(',')[2]}`", what, f"{mode['decisions']['same_side_mean']:.0%}",
                     _de_dearer(mode["decision_logs"]), pct(e["pe_path_bytes"]["rel_error"]),
                     pct(e["de_path_bytes"]["rel_error"]),
                     f"{pct(e['ttft_p50_s']['rel_error'])} ({e['ttft_p50_s']['verdict']})",
                     f"{pct(e['jct_s']['rel_error'])} ({e['jct_s']['verdict']})"])
    return table(["agents", "the code", "same read side as the simulator",
                  "turns whose DE side cost more in the runtime", "PE path bytes error",
                  "DE path bytes error", "TTFT p50 error", "JCT error"], rows)


def _de_dearer(logs: Node) -> str:
    """Of the turns with a hit, those whose DE side the read-side rule costed higher in the first
    runtime run than in the simulation (the logs' `de_cost_tokens`, metrics/decisions.py); "-" for
    logs written before the costs."""
    sim = {d["request"]: d for d in logs["sim"]}
    turns = [(d, sim[d["request"]]) for d in logs["runtime"][0] if d["hit_tokens"] and d["request"] in sim]
    if any(d.get("de_cost_tokens", -1) < 0 for pair in turns for d in pair):
        return "-"
    return f"{sum(rt['de_cost_tokens'] > s['de_cost_tokens'] for rt, s in turns)} of {len(turns)}"
