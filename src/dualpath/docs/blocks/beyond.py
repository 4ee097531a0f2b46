"""Beyond the paper: split reads (`dualpath+split`) against DualPath on the grid of
experiments/beyond.py, from its JSON."""

from __future__ import annotations

from ..fmt import met, num, pct, ratio, sig, table
from ..registry import block
from ..results import Node, Results

BEYOND_JSON = "beyond/beyond.json"
BEYOND_COMMAND = ("dualpath repro --only beyond --out DIR (then DIR/beyond.json and DIR/beyond.png copied to "
                  "docs/results/beyond/)")
MODES = ("basic", "dualpath", "dualpath+split", "oracle")


@block("beyond", reads=(BEYOND_JSON,), command=BEYOND_COMMAND)
def beyond(r: Results) -> str:
    d = r.json(BEYOND_JSON)
    g, t = d["goals"], d["thresholds"]
    rows = [_row(p) for p in d["table"]]
    text = (f"Scale `{d['scale']}`, seed {d['seed']}, simulator code `{d['simulator_code']}`, {num(d['num_sims'])} "
            f"simulations ({num(d['sim_wall_s'])} s). The goals of split reads hold on **{g['num_hold']} of "
            f"{g['num_points']} grid points**: JCT at most {pct(t['no_regression_jct_fraction'], 0, False)} over "
            f"dualpath's on {g['num_no_regression']} of {g['num_points']}; on the unbalanced ones (PE SNICs at a "
            f"fraction of the DE's, offline and with agents that wait), at least "
            f"{pct(t['unbalanced_jct_gain_fraction'], 0, False)} lower JCT or "
            f"{pct(t['unbalanced_ttft_p99_gain_fraction'], 0, False)} lower TTFT p99 on {g['num_unbalanced_gain']} of "
            f"{g['num_unbalanced']}.")
    header = ["point", "agents", *(f"JCT s {m}" for m in MODES), "split JCT / dualpath", "split TTFT p99 / dualpath",
              "split TTFT p50 / dualpath", "PE / DE path GB, dualpath", "PE / DE path GB, split", "binding, dualpath / split",
              "goal"]
    rechecks = _rechecks(d["table"], "split_jct_over_dualpath", "split_jct_over_dualpath", "num_no_regression",
                         "split's JCT over dualpath's", f"within {pct(t['no_regression_jct_fraction'], 0, False)}")
    return text + rechecks + "\n\n" + table(header, rows)


def _rechecks(points: list, ratios_key: str, goal_key: str, count_key: str, what: str, verdict: str) -> str:
    """The points whose goal failed on the run's seed, each run again on other workloads
    (experiments/common.py `other_seeds`): the seed's ratio, the other seeds' and how many hold."""
    out = []
    for p in points:
        r = p.get("recheck")
        if r is not None:
            ratios = ", ".join(ratio(x, 3) for x in r[ratios_key])
            out.append(f" {p['point']}, at {ratio(p['goal'][goal_key], 3)}, run again on seeds {r['seeds'][0]} to "
                       f"{r['seeds'][-1]}: {what} {ratios}, {verdict} on {r[count_key]} of {len(r['seeds'])}.")
    return "".join(out)


def _row(p: Node) -> list[str]:
    modes, goal = p["modes"], p["goal"]
    dual, split = modes["dualpath"], modes["dualpath+split"]
    return [p["point"], num(p["agents"]), *(sig(modes[m]["jct_s"]) for m in MODES),
            f"**{ratio(goal['split_jct_over_dualpath'], 3)}**", ratio(goal["split_ttft_p99_over_dualpath"], 3),
            ratio(split["ttft_p50_over_dualpath"], 3),
            f"{_gb(dual['pe_path_bytes'])} / {_gb(dual['de_path_bytes'])}",
            f"{_gb(split['pe_path_bytes'])} / {_gb(split['de_path_bytes'])}",
            f"{_binding(dual)} / {_binding(split)}", "holds" if goal["holds"] else "**fails**"]


def _gb(num_bytes: float) -> str:
    return num(num_bytes / 1e9, 1)


def _binding(mode: Node) -> str:
    names = {"pe_snic_read": "PE SNIC", "de_snic_read": "DE SNIC", "pe_compute": "PE compute"}
    return f"{names[mode['binding']]} {pct(mode['utilisation'][mode['binding']], 0, False)}"


TAIL_JSON = "beyond/tail_sweep.json"
TAIL_COMMAND = ("dualpath sweep docs/results/beyond/tail.yaml --out out/tail (then out/tail/sweep.json and sweep.png "
                "copied to docs/results/beyond/tail_sweep.json / .png)")


@block("tail", reads=(TAIL_JSON,), command=TAIL_COMMAND)
def tail(r: Results) -> str:
    """Each mode beside itself with `+tail`, per cluster: JCT and TTFT p50 / p99 with their ratios."""
    rows = r.json(TAIL_JSON)["rows"]
    by = {(x["model"], x["pd"], x["max_len_tokens"], x["agents"], x["mode"]): x for x in rows}
    out, jct, p50, p99 = [], [], [], []
    for key, x in by.items():
        if x["mode"].endswith("+tail"):
            continue
        t = by.get((*key[:4], x["mode"] + "+tail"))
        if t is None:  # a row without its +tail twin is shown by its absence
            continue
        jct.append(t["jct_s"] / x["jct_s"])
        p50.append(t["ttft_p50_s"] / x["ttft_p50_s"])
        p99.append(t["ttft_p99_s"] / x["ttft_p99_s"])
        out.append([x["model"], x["pd"], f"{key[2] // 1024}K", num(key[3]), x["mode"], sig(x["jct_s"]), sig(t["jct_s"]),
                    ratio(jct[-1]), f"{sig(x['ttft_p50_s'])} / {sig(t['ttft_p50_s'])}",
                    f"{sig(x['ttft_p99_s'])} / {sig(t['ttft_p99_s'])}", ratio(p99[-1])])
    text = (f"{len(out)} clusters and modes, each beside itself with `+tail`, offline: JCT with `+tail` over JCT "
            f"without from {ratio(min(jct))} to {ratio(max(jct))}; TTFT p99 from {ratio(min(p99))} to {ratio(max(p99))}; "
            f"TTFT p50 from {ratio(min(p50))} to {ratio(max(p50))}.")
    header = ["model", "P/D", "MaxLen", "agents", "mode", "JCT s", "JCT s +tail", "JCT ratio", "TTFT p50 s (+tail)",
              "TTFT p99 s (+tail)", "TTFT p99 ratio"]
    return text + "\n\n" + table(header, out)


TAIL_SCALE_JSON = "beyond/tail_16p32d.json"
TAIL_SCALE_COMMAND = ("dualpath sim --model ds-v3.2-660b --pd 16P32D --max-len 64k --agents 16384 --mode dualpath "
                      "--mode dualpath+tail --seed 1 --workers 2 --json docs/results/beyond/tail_16p32d.json")
# Goals (the policies' issue): +tail at least 20% lower TTFT p99 than dualpath at 48P96D, or the largest
# scale that runs here in under 30 minutes (16P32D, a third of Table 3's cluster and agents), JCT within 2%
TAIL_P99_GOAL = 0.80
TAIL_JCT_GOAL = 1.02


@block("tail_scale", reads=(TAIL_SCALE_JSON,), command=TAIL_SCALE_COMMAND)
def tail_scale(r: Results) -> str:
    """A third of the paper's largest offline run (Table 3), dualpath beside dualpath+tail."""
    d = r.json(TAIL_SCALE_JSON)
    runs = {x["mode"]: x for x in d["runs"]}
    base, tail_run = runs["dualpath"], runs["dualpath+tail"]
    p99 = tail_run["ttft_s"]["p99"] / base["ttft_s"]["p99"]
    jct = tail_run["jct_s"] / base["jct_s"]
    rows = [[m, sig(x["jct_s"]), sig(x["ttft_s"]["p50"]), sig(x["ttft_s"]["p99"]), num(x["tpot_s"]["mean"] * 1e3, 1),
             num(x["wall_s"])] for m, x in runs.items()]
    cl = d["config"]["cluster"]
    text = (f"DS 660B, {cl['num_prefill_nodes']}P{cl['num_decode_nodes']}D, {num(base['num_agents'])} agents at 64K, "
            f"offline: with `+tail` TTFT p99 x{ratio(p99)} "
            f"(goal at most x{ratio(TAIL_P99_GOAL)}: {met(p99 <= TAIL_P99_GOAL)}) and JCT x{ratio(jct, 3)} (goal at most "
            f"x{ratio(TAIL_JCT_GOAL)}: {met(jct <= TAIL_JCT_GOAL)}).")
    return text + "\n\n" + table(["mode", "JCT s", "TTFT p50 s", "TTFT p99 s", "TPOT ms", "sim wall s"], rows)


TOOL_JSON = "beyond/tool_time_sweep.json"
TOOL_COMMAND = ("dualpath sweep docs/results/beyond/tool_time.yaml --out out/tool_time --workers 2 (then "
                "out/tool_time/sweep.json and sweep.png copied to docs/results/beyond/tool_time_sweep.json / .png)")


@block("tool_time", reads=(TOOL_JSON,), command=TOOL_COMMAND)
def tool_time(r: Results) -> str:
    """The paper's offline comparison with agents that wait for tools: dualpath over basic per tool time."""
    rows = r.json(TOOL_JSON)["rows"]
    by = {(x["model"], x["pd"], x["max_len_tokens"], x["agents"], x.get("tool_time_s", 0.0), x["mode"]): x for x in rows}
    out, gains = [], {}
    for key, b in sorted(by.items()):
        d = by.get((*key[:5], "dualpath"))
        if key[5] != "basic" or d is None:  # a point without both modes is shown by its absence
            continue
        gain = b["jct_s"] / d["jct_s"]
        gains.setdefault(key[4], []).append(gain)
        out.append([b["model"], b["pd"], f"{key[2] // 1024}K", num(key[3]), f"{key[4]:g}", sig(b["jct_s"]), sig(d["jct_s"]),
                    f"**{ratio(gain)}**", f"{sig(b['ttft_p99_s'])} / {sig(d['ttft_p99_s'])}", num(b["num_turns"])])
    per_tool = "; ".join(f"{t:g} s: x{ratio(min(g))} to x{ratio(max(g))}" for t, g in sorted(gains.items()))
    text = (f"{len(out)} points, offline, each agent waiting a log-normal tool time (the median below, sigma 1) "
            f"between its rounds. DualPath's JCT speed-up over basic (basic's JCT over dualpath's), by median tool "
            f"time: {per_tool}.")
    header = ["model", "P/D", "MaxLen", "agents", "tool time s (median)", "JCT s basic", "JCT s dualpath",
              "speed-up", "TTFT p99 s basic / dualpath", "turns"]
    return text + "\n\n" + table(header, out)


SELECTIVE_JSON = "beyond/selective.json"
SELECTIVE_COMMAND = ("dualpath repro --only selective --out DIR --workers 2 (then DIR/selective.json and "
                     "DIR/selective.png copied to docs/results/beyond/)")
SELECTIVE_MODES = ("basic", "dualpath", "selective", "dualpath+selective")


@block("selective", reads=(SELECTIVE_JSON,), command=SELECTIVE_COMMAND)
def selective(r: Results) -> str:
    """Decode-local prefill (experiments/selective.py): the Table 2 MaxLens, then the threshold sweep."""
    d = r.json(SELECTIVE_JSON)
    g = d["goals"]
    rows = []
    for p in d["table"]:
        modes = p["modes"]
        rows.append([p["point"], num(p["agents"]), *(sig(modes[m]["jct_s"]) for m in SELECTIVE_MODES),
                     *(f"{ratio(modes[m]['jct_over_dualpath'], 3)}" for m in SELECTIVE_MODES[2:]),
                     *(f"{sig(modes[m]['ttft_p99_s'])}" for m in SELECTIVE_MODES[1:]),
                     *(num(modes[m]["tpot_mean_s"] * 1e3, 1) for m in SELECTIVE_MODES[1:]),
                     pct(modes["dualpath+selective"]["local_fraction"], 0, False),
                     f"{ratio(p['goal']['jct_over_better'], 3)} ({'holds' if p['goal']['holds'] else '**fails**'})"])
    header = ["point", "agents", *(f"JCT s {m}" for m in SELECTIVE_MODES), "JCT x dualpath, selective",
              "JCT x dualpath, dualpath+selective", *(f"TTFT p99 s {m}" for m in SELECTIVE_MODES[1:]),
              *(f"TPOT ms {m}" for m in SELECTIVE_MODES[1:]), "local turns", "goal: x the better"]
    sweep = []
    for s in d["sweep"]:
        for m, xs in s["modes"].items():
            for x in xs:
                sweep.append([s["point"], m, num(x["threshold_tokens"]), pct(x["local_fraction"], 0, False),
                              ratio(x["jct_over_dualpath"], 3), ratio(x["ttft_p99_over_dualpath"], 3),
                              num(x["tpot_mean_s"] * 1e3, 1)])
    text = (f"Scale `{d['scale']}`, seed {d['seed']}, simulator code `{d['simulator_code']}`, {num(d['num_sims'])} "
            f"simulations ({num(d['sim_wall_s'])} s). Threshold {num(d['default_threshold_tokens'])} uncached tokens. "
            f"The goal (dualpath+selective's JCT at most the better of dualpath's and selective's) holds on "
            f"**{g['num_hold']} of {g['num_points']} points**."
            + _rechecks(d["table"], "jct_over_better", "jct_over_better", "num_hold", "dualpath+selective's JCT over the better",
                        "the goal holding"))
    sweep_header = ["point", "mode", "threshold, tokens", "local turns", "JCT x dualpath", "TTFT p99 x dualpath", "TPOT ms"]
    return text + "\n\n" + table(header, rows) + "\n\nThe threshold sweep:\n\n" + table(sweep_header, sweep)


DRAM_JSON = "beyond/dram.json"
DRAM_COMMAND = "dualpath repro --only dram --out DIR --workers 2 (then DIR/dram.json and DIR/dram.png copied to docs/results/beyond/)"


@block("dram", reads=(DRAM_JSON,), command=DRAM_COMMAND)
def dram(r: Results) -> str:
    """The host-DRAM tier (experiments/dram.py): each +dram mode by capacity, over its mode without a tier."""
    d = r.json(DRAM_JSON)
    rows = []
    for p in d["table"]:
        base = p["modes"]
        rows.append([p["point"], num(p["agents"]), "basic / dualpath", "-", f"{sig(base['basic']['jct_s'])} / "
                     f"{sig(base['dualpath']['jct_s'])}", "1", ratio(base["basic"]["jct_s"] / base["dualpath"]["jct_s"], 3),
                     f"{sig(base['basic']['ttft_p99_s'])} / {sig(base['dualpath']['ttft_p99_s'])}", "-", "-",
                     f"{base['basic']['binding']} / {base['dualpath']['binding']}"])
        for m, xs in p["tiers"].items():
            for x in xs:
                rows.append([p["point"], num(p["agents"]), m, num(x["capacity_gb"]), sig(x["jct_s"]),
                             ratio(x["jct_over_own"], 3), ratio(x["jct_over_dualpath"], 3), sig(x["ttft_p99_s"]),
                             ratio(x["ttft_p99_over_own"], 3), pct(x["dram_share"], 0, False), x["binding"]])
    text = (f"Scale `{d['scale']}`, seed {d['seed']}, simulator code `{d['simulator_code']}`, {num(d['num_sims'])} "
            f"simulations ({num(d['sim_wall_s'])} s). Offline, MaxLen 64K; tool time: log-normal, median "
            f"{d['tool_time_median_s']:g} s, sigma 1. `x own`: over the same mode without a tier; `DRAM share`: the "
            f"hit bytes the tiers served instead of storage.")
    header = ["point", "agents", "mode", "GB per node", "JCT s", "JCT x own", "JCT x dualpath", "TTFT p99 s",
              "TTFT p99 x own", "DRAM share", "binding"]
    return text + "\n\n" + "\n".join(_dram_summary(p) for p in d["table"]) + "\n\n" + table(header, rows)


def _dram_summary(p: Node) -> str:
    """One line per point: each +dram mode's JCT over its own without a tier, across the capacities."""
    parts = []
    for m, xs in p["tiers"].items():
        own = [x["jct_over_own"] for x in xs]
        share = [x["dram_share"] for x in xs]
        parts.append(f"{m} x{ratio(min(own), 3)} to x{ratio(max(own), 3)} of {m.removesuffix('+dram')}'s JCT "
                     f"(DRAM share {pct(min(share), 0, False)} to {pct(max(share), 0, False)})")
    base = p["modes"]
    return (f"- {p['point']} (binding without a tier: basic {base['basic']['binding']}, dualpath "
            f"{base['dualpath']['binding']}): " + "; ".join(parts) + ".")


POLICIES_JSON = "beyond/policies.json"
POLICIES_COMMAND = ("dualpath repro --only policies --out DIR --workers 2 (then DIR/policies.json and DIR/policies.png "
                    "copied to docs/results/beyond/)")


@block("policies", reads=(POLICIES_JSON,), command=POLICIES_COMMAND)
def policies(r: Results) -> str:
    """Every mode on the split-read grid (experiments/policies.py): per mode over the grid, then per point."""
    d = r.json(POLICIES_JSON)
    modes = d["modes"]
    rows = [[m, ratio(s["jct_over_dualpath_geomean"], 3), ratio(s["jct_over_dualpath_max"], 3),
             ratio(s["ttft_p99_over_dualpath_geomean"], 3), num(len(s["best_jct_points"]))]
            for m, s in ((m, d["summary"][m]) for m in modes)]
    points = [[p["point"], *(ratio(p["modes"][m]["jct_over_dualpath"], 3) for m in modes), p["best_jct_mode"],
               p["modes"]["dualpath"]["binding"]] for p in d["table"]]
    text = (f"Scale `{d['scale']}`, seed {d['seed']}, simulator code `{d['simulator_code']}`, {num(d['num_sims'])} "
            f"simulations ({num(d['sim_wall_s'])} s), {num(d['table'][0]['agents'])} agents a point, offline. Over the "
            f"grid's {num(len(d['table']))} points (geometric means; `best`: points where the mode's JCT is the lowest "
            f"but the oracle's):")
    return (text + "\n\n" + table(["mode", "JCT x dualpath", "worst JCT x dualpath", "TTFT p99 x dualpath", "best"], rows)
            + "\n\nJCT over dualpath's per point:\n\n"
            + table(["point", *modes, "lowest JCT", "dualpath's binding"], points))
