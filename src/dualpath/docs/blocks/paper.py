"""The paper's experiments in the simulator: Table 1, the `dualpath repro` headlines, the pinned
Fig. 7 and P/D-ratio runs, one-knob sensitivity runs, and the calibration knobs."""

from __future__ import annotations

import re

from ..fmt import met, num, pct, ratio, sig, table
from ..registry import block
from ..results import Node, Results

REPRO = "dualpath repro --out DIR (then DIR without DIR/cache copied to docs/results/repro/)"
FIG7_RUNS = tuple(f"ds660b_2p4d_64k_{agents}_seed{seed}.json" for agents in (1024, 2048) for seed in (1, 2, 3))
PD_RUNS = tuple(f"ds27b_{pd}_64k_512.json" for pd in ("1P1D", "2P1D", "1P2D"))
SENSITIVITY_RUNS = tuple(f"sensitivity/{name}_{agents}.json" for name in ("decode_tpot_calibrated", "no_fig3_overhead",
                                                                         "snic_line_rate") for agents in (1024, 2048))
# A summary.json written before the sources moved into this repository names the old briefs (an
# upper-case file name and a section number); they are shown by their copies here, with the same
# section numbers: "docs/hardware.md §1.3", as the code's comments cite them
CITED_DOCS_RE = re.compile(r"\b(HARDWARE|PAPER)\.md( (?=\d))?")


@block("table1", reads=("repro/table1.json",), command=REPRO)
def table1(r: Results) -> str:
    t1 = r.json("repro/table1.json")
    rows = [[m["label"], sig(m["ctx_16k"]), sig(m["ctx_32k"]), sig(m["ctx_48k"]), sig(m["ctx_64k"]),
             f"{sig(m['paper_16k'], 2)} / {sig(m['paper_64k'], 2)}",
             f"{pct(m['ctx_16k'] / m['paper_16k'] - 1)} / {pct(m['ctx_64k'] / m['paper_64k'] - 1)}"] for m in t1["table"]]
    heads = list(t1["headlines"])
    missed = [h for h in heads if not h["met"]]
    text = f"{sum(h['met'] for h in heads)} of {len(heads)} headlines within their {pct(heads[0]['target'], 0, False)} target"
    if missed:
        text += "; missed: " + ", ".join(f"{h['metric']} ({sig(h['ours'])} against {sig(h['paper'])}, {pct(h['rel_error'])})"
                                         for h in missed)
    return table(["model", "16K", "32K", "48K", "64K", "paper 16K / 64K", "error 16K / 64K"], rows) + f"\n\n{text}."


@block("table1_implied", reads=("repro/table1.json",), command=REPRO)
def table1_implied(r: Results) -> str:
    rows = [[m["label"], f"{sig(m['ours_linear_gflop'])} / {sig(m['implied_linear_gflop'])}",
             f"{m['ours_attn_mflop_per_key']:.3f} / {m['implied_attn_mflop_per_key']:.3f} "
             f"({m['implied_attn_mflop_per_key_range'][0]:.3f}-{m['implied_attn_mflop_per_key_range'][1]:.3f})"]
            for m in r.json("repro/table1.json")["implied"]]
    return table(["model", "linear GFLOP per token, ours / implied",
                  "attention MFLOP per cached key, ours / implied (range)"], rows)


@block("repro_summary", reads=("repro/summary.json",), command=REPRO)
def repro_summary(r: Results) -> str:
    s = r.json("repro/summary.json")
    c = s["counts"]
    rows = [[name, e["num_sims"], num(e["sim_wall_s"]), f"{e['met']} / {e['headlines']}"
             + (f" (+{e['by_construction']} by construction)" if e["by_construction"] else ""),
             f"{e['hardware_only_met']} / {e['hardware_only_simulated']}"]
            for name in dict.fromkeys(h["experiment"] for h in s["headlines"]) for e in [s["experiments"][name]]]
    text = (f"Scale `{s['scale']}`, seed {s['seed']}, simulator code `{s['simulator_code']}`: {counts_sentence(c)} "
            f"With every fitted knob at its hardware-only estimate, {c['hardware_only_met']} of the "
            f"{c['hardware_only_simulated']} headlines simulated that way are met "
            f"({c['fitted_without_hardware_only']} have no hardware-only value).")
    return text + "\n\n" + table(["experiment", "simulations", "simulation wall s", "headlines met", "hardware-only met"], rows)


def counts_sentence(c: Node) -> str:
    """What the reproduction can claim: independent agreements first, then the headlines by the
    evidence behind them, then the knobs behind them by kind (experiments/suite.py writes `counts`)."""
    k = c["knobs"]
    fitted = ", ".join(f"{n} to {figure}" for figure, n in k["fitted"].items())
    return (f"**{c['independent_met']} of {c['independent']} independent agreements met** (distinct sets of "
            f"simulations; a headline on runs already counted adds none). By headline: {c['met']} of {c['headlines']} "
            f"met, of which {c['simulated_met']} of {c['simulated']} simulated, {c['arithmetic_met']} of "
            f"{c['arithmetic']} arithmetic checks of the cost model and {c['derived_met']} of {c['derived']} derived "
            f"from other headlines, besides {c['by_construction']} met by construction (listed apart). Behind them: "
            f"{k['hardware']} hardware-sourced knobs, {k['paper']} paper settings, {k['choice']} project choices and "
            f"{sum(n for _, n in k['fitted'].items())} knobs fitted to the paper's own data ({fitted}).")


def _error(h: Node, value: float | None) -> str:
    if value is None:
        return "-"
    if h["kind"] == "points":
        return f"{value - h['paper']:+.1f} pt"
    return pct(value / h["paper"] - 1)


def _target(h: Node) -> str:
    return {"points": f"{h['target']:g} pt", "max": "<= paper"}.get(h["kind"], pct(h["target"], 0, False))


def _hardware_only(h: Node) -> str:
    if h["by_construction"] or not h["fitted"]:
        return "-"
    if h["hardware_only"] is None:
        return "no value"
    return f"{sig(h['hardware_only'])} ({_error(h, h['hardware_only'])}, {'met' if h['hardware_only_met'] else 'missed'})"


@block("repro_headlines", reads=("repro/summary.json",), command=REPRO)
def repro_headlines(r: Results) -> str:
    rows = [[h["experiment"], h["metric"], sig(h["ours"]), f"{sig(h['paper'])} {h['source']}", _error(h, h["ours"]),
             _target(h), met(h["met"]) + (" (by construction)" if h["by_construction"] else ""), _hardware_only(h)]
            for h in r.json("repro/summary.json")["headlines"]]
    return (table(["experiment", "metric", "ours", "paper", "error", "target", "result", "hardware-only (error, result)"], rows)
            + "\n\nWhy each miss, as the report states it:\n\n" + _miss_notes(r.json("repro/summary.json")))


def _miss_notes(summary: Node) -> str:
    """One bullet per distinct note of the missed headlines, naming the headlines it explains."""
    notes: dict[str, list[str]] = {}
    for h in summary["headlines"]:
        if not h["met"] and h["note"]:
            notes.setdefault(_cited(h["note"]), []).append(f"{h['experiment']}: {h['metric']}")
    return "\n".join(f"- {'; '.join(metrics)}: {note}" for note, metrics in notes.items())


def _jct(run: Node) -> dict[str, float]:
    return {m["mode"]: m["jct_s"] for m in run["runs"]}


def _paper_speedup(summary: Node, agents: int) -> float:
    prefix = f"DS 660B 64K speedup over basic @ {agents} agents"
    return next(h["paper"] for h in summary["headlines"] if str(h["metric"]).startswith(prefix))


def _ep_on_cnics(run: Node) -> str:
    return "yes" if run["config"]["cluster"].get("ep_over_cnic") else "no (not in its config)"


@block("fig7_pinned", reads=FIG7_RUNS + ("repro/summary.json",),
       command="dualpath sim --model ds-v3.2-660b --pd 2P4D --max-len 64k --agents N --seed S --mode basic --mode dualpath "
               "--mode oracle --json docs/results/ds660b_2p4d_64k_N_seedS.json")
def fig7_pinned(r: Results) -> str:
    summary, rows = r.json("repro/summary.json"), []
    for rel in FIG7_RUNS:
        run = r.json(rel)
        jct, agents = _jct(run), run["workload"]["num_agents"]
        speedup, paper = jct["basic"] / jct["dualpath"], _paper_speedup(summary, agents)
        rows.append([num(agents), run["config"]["workload"]["seed"], num(jct["basic"]), num(jct["dualpath"]),
                     num(jct["oracle"]), ratio(speedup), ratio(paper), pct(speedup / paper - 1), _ep_on_cnics(run)])
    return table(["agents", "seed", "JCT basic s", "JCT dualpath s", "JCT oracle s", "basic / dualpath", "paper",
                  "error", "EP bursts on the CNICs"], rows)


@block("pd_ratio_pinned", reads=PD_RUNS,
       command="dualpath sim --model ds-27b --pd PD --agents 512 --mode basic --mode dualpath --mode oracle "
               "--json docs/results/ds27b_PD_64k_512.json")
def pd_ratio_pinned(r: Results) -> str:
    rows = []
    for rel in PD_RUNS:
        run = r.json(rel)
        jct, c = _jct(run), run["config"]["cluster"]
        rows.append([f"{c['num_prefill_nodes']}P{c['num_decode_nodes']}D", num(jct["basic"]), num(jct["dualpath"]),
                     num(jct["oracle"]), ratio(jct["dualpath"] / jct["oracle"])])
    return table(["P/D", "JCT basic s", "JCT dualpath s", "JCT oracle s", "dualpath / oracle"], rows)


def _flat(node: Node, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in node.items():
        if isinstance(value, Node) and isinstance(value.raw, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value.raw if isinstance(value, Node) else value
    return out


def _changed_knobs(run: Node, pinned: Node) -> str:
    """`--set` of each config field both runs have and whose values differ (the workload's aside)."""
    mine, base = _flat(run["config"]), _flat(pinned["config"])
    diff = [k for k in mine if k in base and mine[k] != base[k] and not k.startswith("workload.")]
    return ", ".join(f"`--set {k}={'none' if mine[k] is None else mine[k]}`" for k in diff)


@block("sensitivity", reads=SENSITIVITY_RUNS + ("ds660b_2p4d_64k_1024_seed1.json", "ds660b_2p4d_64k_2048_seed1.json"),
       command="dualpath sim --model ds-v3.2-660b --pd 2P4D --max-len 64k --agents N --seed 1 --mode basic "
               "--mode dualpath --mode oracle --set KNOB=VALUE --json docs/results/sensitivity/NAME_N.json")
def sensitivity(r: Results) -> str:
    rows = []
    for rel in SENSITIVITY_RUNS:
        run = r.json(rel)
        agents = run["workload"]["num_agents"]
        jct = _jct(run)
        rows.append([_changed_knobs(run, r.json(f"ds660b_2p4d_64k_{agents}_seed1.json")), num(agents), num(jct["basic"]),
                     num(jct["dualpath"]), ratio(jct["basic"] / jct["dualpath"]), _ep_on_cnics(run)])
    return table(["knob changed", "agents", "JCT basic s", "JCT dualpath s", "basic / dualpath", "EP bursts on the CNICs"], rows)


def _knob_value(value: object) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (abs(value) >= 1e6 or 0 < abs(value) < 1e-2):
        return f"{value:.4g}"
    return str(value)


def _cited(source: str) -> str:
    return CITED_DOCS_RE.sub(lambda m: f"docs/{m.group(1).lower()}.md" + (" §" if m.group(2) else ""), source)


@block("knobs", reads=("repro/summary.json",), command=REPRO)
def knobs(r: Results) -> str:
    labels = {"hardware": "hardware-sourced", "paper": "paper setting", "choice": "project choice"}
    rows = []
    for k in r.json("repro/summary.json")["knobs"]:
        kind = f"**fitted to {k['figure']}**" if k["kind"] == "fitted" else labels.get(k["kind"], k["kind"])
        hw = f" Hardware-only estimate: `{', '.join(k['hardware_only'])}`." if len(k["hardware_only"]) else ""
        rows.append([f"`{k['knob']}`", _knob_value(k["value"]), kind, _cited(k["source"]) + hw])
    return table(["knob", "value", "kind", "source"], rows)
