"""Table 3 (docs/paper.md §6.7): DualPath at scale. Offline: 2P4D with 2K agents against 48P96D (1,152
GPUs) with 48K agents, JCT; online: 2P4D at 0.4 APS against 44P88D at 8.8 APS, TTFT / TTST / TPOT
(means, with Fig. 10's warm-up, horizon and measurement); scheduler decisions per second and CPU
time per decision (the simulator's `scheduler.decisions` and `policy_wall_s`).

MaxLen is [NF]: 64K, the dataset of the paper's DS 660B runs. The paper's own 2P4D 2K-agent JCT
(3,167 s) is well below its Fig. 7 2048-agent 64K bar (5,365 s [F]), so Table 3 may use a shorter
MaxLen; the scale target is relative (ours at 48P96D within 5% of ours at 2P4D).
"""

from __future__ import annotations

import math
from typing import Any

from .common import (
    Context, ExperimentOutput, Headline, headline_table, md_table, pyplot, ratio, save_figure, scale_note, with_hardware_only,
)
from .fig10_11 import ds660b_setup
from .simrun import SimSpec, hardware_only, online_spec, simulate

NAME = "table3"
TITLE = "Table 3: large scale (DS 660B)"
MODEL = "ds-v3.2-660b"
PAPER_OFFLINE = {"small": 3167.0, "large": 3201.0}  # [P]
PAPER_ONLINE = {"small": {"ttft": 1.739, "ttst": 0.228, "tpot": 0.039}, "large": {"ttft": 1.847, "ttst": 0.194, "tpot": 0.036}}  # [P]
PAPER_SCHEDULER_CORES = 10.0  # [P] "below 10 cores"
SCALE_TARGET = 0.05
ONLINE_TARGET = 0.25  # Fig. 10's tolerance for online numbers (the paper gives none here)
SCHEDULER_BY_CONSTRUCTION = (
    "a ceiling ~100x above ours: the simulator times only the shared policy code of its scheduling passes (no "
    "RPCs, no state collection, no real cluster), so any plausible value is below the paper's 10 cores")
HARDWARE_ONLY_SKIPPED = (
    "hardware-only not simulated at full scale: the 48P96D and 44P88D runs are the suite's most expensive (sim wall s "
    "in the table)")
MISS_NOTES = {
    "ttft": "our DualPath has more capacity, so the load is lighter",
    "ttst": "engine-side second-token costs not modelled",
    "tpot": "decode modelled as HBM-bound steps without engine overheads",
}
ONLINE_NOTE = (
    "Modelling assumptions behind the absolute online numbers. TPOT: the decode model is HBM-bound at 90% of H800 "
    "bandwidth plus per-layer EP latency (config.py), and comes out faster than the paper's 36-39 ms; per-step "
    "engine overheads are not modelled. TTST: the simulator's second token waits only for the last KV bytes, the "
    "H2D copy and one decode step, while the paper's 0.19-0.23 s includes engine-side costs not modelled. TTFT: "
    "our DualPath's capacity is higher than the paper's (Figs. 10-11), so 0.4 APS is a lighter load for it than for "
    "the testbed. What the table claims, similar latency at 22x the load and nodes, is checked by comparing the "
    "two rows."
)


def offline_shapes(ctx: Context) -> dict[str, tuple[str, int]]:
    """small / large: (P/D, agents); the large one is 24x the small in nodes and agents (full)."""
    return ctx.pick({"small": ("2P4D", 2048), "large": ("48P96D", 49152)},
                    {"small": ("2P4D", 128), "large": ("8P16D", 512)},
                    {"small": ("2P4D", 8), "large": ("4P8D", 16)})


def online_shapes(ctx: Context) -> dict[str, tuple[str, float]]:
    """small / large: (P/D, APS); 22x in nodes and APS (full)."""
    return ctx.pick({"small": ("2P4D", 0.4), "large": ("44P88D", 8.8)},
                    {"small": ("2P4D", 0.4), "large": ("4P8D", 0.8)},
                    {"small": ("2P4D", 0.2), "large": ("4P8D", 0.4)})


def run(ctx: Context) -> ExperimentOutput:
    table = _rows(ctx, ("small", "large"), hardware_only_knobs=False)
    # The headlines' runs with every fitted knob at its hardware-only estimate; at full scale only the 2P4D ones
    hw_table = _rows(ctx, ctx.pick(("small",), ("small", "large")), hardware_only_knobs=True)
    headlines = with_hardware_only(_headlines(table), _headlines(hw_table), HARDWARE_ONLY_SKIPPED)
    fig = _figure(ctx, table)
    md = _markdown(ctx, table, headlines)
    return ExperimentOutput(NAME, TITLE, table, headlines, [fig], md, extra={"hardware_only": hw_table})


def planned(ctx: Context) -> list[SimSpec]:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    groups = ((("small", "large"), False), (ctx.pick(("small",), ("small", "large")), True))
    return [s for sizes, hw in groups for kind in ("offline", "online") for _, s in _specs(ctx, kind, sizes, hw)]


def _specs(ctx: Context, kind: str, sizes: tuple[str, ...], hardware_only_knobs: bool) -> list[tuple[str, SimSpec]]:
    """(size, spec) of the offline or online rows."""
    setup = ds660b_setup(ctx)
    out = []
    for size, (pd, x) in (offline_shapes(ctx) if kind == "offline" else online_shapes(ctx)).items():
        if size in sizes:
            spec = (SimSpec(MODEL, pd, setup.max_len, x, "dualpath") if kind == "offline"
                    else online_spec(MODEL, pd, setup.max_len, "dualpath", x, setup.horizon_s, setup.warmup_s))
            out.append((size, hardware_only(spec) if hardware_only_knobs else spec))
    return out


def _rows(ctx: Context, sizes: tuple[str, ...], hardware_only_knobs: bool) -> list[dict[str, Any]]:
    table: list[dict[str, Any]] = []
    for size, spec in _specs(ctx, "offline", sizes, hardware_only_knobs):
        r = simulate(ctx, spec)
        table.append({"kind": "offline", "size": size, "pd": spec.pd, "agents": spec.num_agents, "aps": None, "jct_s": r["jct_s"],
                      "paper_jct_s": PAPER_OFFLINE[size], **_scheduler(r), "run": spec.run_id()})
    for size, spec in _specs(ctx, "online", sizes, hardware_only_knobs):
        r = simulate(ctx, spec)
        on = r["probe"]["online"]
        table.append({"kind": "online", "size": size, "pd": spec.pd, "agents": spec.num_agents, "aps": online_shapes(ctx)[size][1],
                      "ttft_mean_s": on["ttft_mean_s"], "ttst_mean_s": on["ttst_mean_s"], "tpot_mean_s": on["tpot_mean_s"],
                      "ttft_window_max_s": on["ttft_window_max_s"],
                      **{f"paper_{k}_s": v for k, v in PAPER_ONLINE[size].items()}, **_scheduler(r), "run": spec.run_id()})
    return table


def _headlines(table: list[dict[str, Any]]) -> list[Headline]:
    """The headlines `table` has the runs for (a hardware-only table may lack the large runs)."""
    off = {r["size"]: r for r in table if r["kind"] == "offline"}
    onl = {r["size"]: r for r in table if r["kind"] == "online"}
    headlines = []
    if len(off) == 2:
        headlines.append(Headline(NAME, f"offline JCT {off['large']['pd']} / {off['small']['pd']}",
                                  ratio(off["large"]["jct_s"], off["small"]["jct_s"]), 1.0, SCALE_TARGET,
                                  note="paper: 3,201 / 3,167 = 1.011, 'near-linear'", runs=frozenset(r["run"] for r in off.values())))
    for size in onl:
        for k in ("ttft", "ttst", "tpot"):
            headlines.append(Headline(NAME, f"online {k.upper()} mean, {onl[size]['pd']} at {onl[size]['aps']:g} APS",
                                      onl[size][f"{k}_mean_s"], PAPER_ONLINE[size][k], ONLINE_TARGET,
                                      note=f"target: Fig. 10's 25%; {MISS_NOTES[k]} (see the table3 section)",
                                      runs=frozenset([onl[size]["run"]])))
    if len(onl) < 2:
        return headlines
    paper_ttft_ratio = PAPER_ONLINE["large"]["ttft"] / PAPER_ONLINE["small"]["ttft"]
    headlines.append(Headline(NAME, f"online TTFT {onl['large']['pd']} / {onl['small']['pd']} (similar latency at scale)",
                              ratio(onl["large"]["ttft_mean_s"], onl["small"]["ttft_mean_s"]), paper_ttft_ratio, ONLINE_TARGET,
                              note="paper: 1.847 / 1.739", runs=frozenset(r["run"] for r in onl.values())))
    busiest = max(table, key=lambda r: r["scheduler_cores"] if math.isfinite(r["scheduler_cores"]) else -1.0)
    headlines.append(Headline(NAME, f"scheduler CPU cores (policy wall / simulated s, {busiest['pd']} {busiest['kind']})",
                              busiest["scheduler_cores"], PAPER_SCHEDULER_CORES, 0.0, kind="max",
                              by_construction=SCHEDULER_BY_CONSTRUCTION, runs=frozenset([busiest["run"]])))
    return headlines


def _markdown(ctx: Context, table: list[dict[str, Any]], headlines: list[Headline]) -> str:
    setup = ds660b_setup(ctx)
    return "\n\n".join([
        scale_note(ctx) + f"DS 660B, DualPath, MaxLen {setup.max_len // 1024}K. Online: warm-up {setup.warmup_s:g} s, "
        f"horizon {setup.horizon_s:g} s, means over turns arriving after the warm-up (TTFT counts turns still waiting).",
        md_table(["run", "P/D", "agents", "JCT s", "paper JCT s", "decisions/s", "CPU us/decision", "scheduler cores", "turns",
                  "sim wall s", "simulated turns/s"],
                 [[r["size"], r["pd"], r["agents"], r["jct_s"], r["paper_jct_s"], r["decisions_per_s"], r["cpu_us_per_decision"],
                   r["scheduler_cores"], r["turns"], r["wall_s"], ratio(r["turns"], r["wall_s"])]
                  for r in table if r["kind"] == "offline"]),
        md_table(["run", "P/D", "APS", "TTFT s", "paper", "TTST s", "paper", "TPOT s", "paper", "decisions/s", "CPU us/decision",
                  "sim wall s"],
                 [[r["size"], r["pd"], r["aps"], r["ttft_mean_s"], r["paper_ttft_s"], r["ttst_mean_s"], r["paper_ttst_s"],
                   r["tpot_mean_s"], r["paper_tpot_s"], r["decisions_per_s"], r["cpu_us_per_decision"], r["wall_s"]]
                  for r in table if r["kind"] == "online"]),
        "Scheduler cost: decisions = PE and DE assignments; CPU is the wall time of the shared policy code inside the "
        "simulator's scheduling passes (one Python thread), so 'cores' = policy seconds per simulated second. "
        "Sim wall s is the simulation's own wall time when it was run (one Python thread; from DIR/cache if cached).",
        headline_table(headlines),
        ONLINE_NOTE,
        "![Table 3](table3.png)",
    ])


def _scheduler(r: dict[str, Any]) -> dict[str, Any]:
    decisions = r["scheduler"]["decisions"]
    duration = r["sim_duration_s"]
    return {"decisions": decisions, "decisions_per_s": ratio(decisions, duration),
            "cpu_us_per_decision": 1e6 * ratio(r["policy_wall_s"], decisions),
            "scheduler_cores": ratio(r["policy_wall_s"], duration), "wall_s": r["wall_s"], "turns": r["num_turns"]}


def _figure(ctx: Context, table: list[dict[str, Any]]) -> str:
    plt = pyplot()
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10, 3.4))
    off = [r for r in table if r["kind"] == "offline"]
    xs = range(len(off))
    ax0.bar([x - 0.2 for x in xs], [r["jct_s"] for r in off], 0.4, label="ours")
    ax0.bar([x + 0.2 for x in xs], [r["paper_jct_s"] for r in off], 0.4, label="paper")
    ax0.set_xticks(list(xs), [f"{r['pd']}\n{r['agents']} agents" for r in off])
    ax0.set_ylabel("JCT (s)")
    ax0.set_title("offline", fontsize=9)
    ax0.legend(fontsize=7)
    onl = [r for r in table if r["kind"] == "online"]
    keys = ("ttft", "ttst", "tpot")
    width = 0.8 / (2 * len(onl))
    for i, r in enumerate(onl):
        for j, src in enumerate(("ours", "paper")):
            vals = [r[f"{k}_mean_s"] if src == "ours" else r[f"paper_{k}_s"] for k in keys]
            off_x = (2 * i + j - len(onl) + 0.5) * width
            ax1.bar([k + off_x for k in range(3)], vals, width, label=f"{src} {r['pd']} {r['aps']:g} APS")
    ax1.set_xticks(range(3), ["TTFT", "TTST", "TPOT"])
    ax1.set_yscale("log")
    ax1.set_ylabel("seconds (mean)")
    ax1.set_title("online", fontsize=9)
    ax1.legend(fontsize=6)
    fig.suptitle("Table 3: scale")
    return save_figure(fig, ctx, "table3.png")
