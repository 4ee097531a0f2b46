"""Figs. 13-14 (docs/paper.md §6.6): load balance, round robin against the DualPath scheduler.

- Storage NICs: Max/Avg of the bytes each SNIC reads in a short window, across the SNICs of three
  machines (1.0 = perfect), averaged over windows where the SNICs are busy (MetricsConfig:
  10 s windows, windows under 20% mean utilisation skipped: the paper drops the underloaded tail).
- Attention: Max/Avg of the attention time among one PE group's GPUs per forward, over the first
  5% of the run.

Setting [I/S]: the figure's file name suggests 48K MaxLen and 1024 trajectories; three machines
mean a 3-node P/D. DS 27B (the model run on 1P2D and 2P1D in Fig. 8). 1P2D is the headline, 2P1D
is reported beside it. Round robin is mode `basic+layerwise+de_read`: round-robin PE and DE
choice, read side alternating PE, DE, PE, ... (docs/paper.md §6.5 [I]).
"""

from __future__ import annotations

import math
from typing import Any

from .common import (
    Context, ExperimentOutput, Headline, headline_table, md_table, pyplot, save_figure, scale_note, with_hardware_only,
)
from .simrun import SimSpec, hardware_only, simulate

NAME = "fig13_14"
TITLE = "Figs. 13-14: SNIC and attention load balance"
MODEL = "ds-27b"
PDS = ("1P2D", "2P1D")
HEADLINE_PD = "1P2D"
MODES = (("basic+layerwise+de_read", "round robin"), ("dualpath", "DualPath"))
PAPER_SNIC = {"basic+layerwise+de_read": 1.53, "dualpath": 1.18}  # [P] (1.528 / 1.184 in the figure)
PAPER_ATTENTION = 1.06  # [P] DualPath, first 5% of the task
TARGET = 0.10  # the paper gives none; 10% separates 1.18 from 1.53 by a wide margin
BY_CONSTRUCTION = {
    "round robin": (
        "the alternating read side sends half of the reads to the one node on one side of a 3-node P/D: 1/2 of the "
        "bytes against a mean of 1/3 is 1.5 whatever the simulator does"),
    "attention": (
        "DualPath's PE batch former fills every GPU of a group to the same 300 ms attention quota, chunking the last "
        "request, so while the queue is full (the first 5% of an offline run) Max/Avg is 1 by construction (the "
        "whole run's, with its underloaded tail, is not); the 10% target is this project's"),
}


def num_agents(ctx: Context) -> int:
    return ctx.pick(1024, 256, 16)


def max_len(ctx: Context) -> int:
    return ctx.pick(49152, 49152, 32768)


def planned(ctx: Context) -> list[SimSpec]:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    return [_spec(ctx, pd, mode) for pd in PDS for mode, _ in MODES] + [hardware_only(_spec(ctx, HEADLINE_PD, "dualpath"))]


def _spec(ctx: Context, pd: str, mode: str) -> SimSpec:
    return SimSpec(MODEL, pd, max_len(ctx), num_agents(ctx), mode)


def run(ctx: Context) -> ExperimentOutput:
    table, series = [], {}
    for pd in PDS:
        for mode, label in MODES:
            spec = _spec(ctx, pd, mode)
            r = simulate(ctx, spec)
            probe = r["probe"]
            table.append({"pd": pd, "mode": mode, "label": label, "snic_max_over_avg": r["snic_max_over_avg"],
                          "snic_max_over_avg_run": r["snic_max_over_avg_run"],
                          "attention_first_5pct": probe["attention"]["first_5pct_mean"],
                          "attention_whole_run": r["prefill_attention_max_over_avg"], "jct_s": r["jct_s"],
                          "de_path_share": _share(r), "run": spec.run_id()})
            series[(pd, mode)] = probe
    head = {r["mode"]: r for r in table if r["pd"] == HEADLINE_PD}
    hw_spec = hardware_only(_spec(ctx, HEADLINE_PD, "dualpath"))
    hw = simulate(ctx, hw_spec)
    headlines = _headlines({m: r["snic_max_over_avg"] for m, r in head.items()}, head["dualpath"]["attention_first_5pct"],
                           {m: r["run"] for m, r in head.items()})
    headlines = with_hardware_only(headlines, _headlines({"dualpath": hw["snic_max_over_avg"]}, None, {"dualpath": hw_spec.run_id()}))
    figs = [_fig13(ctx, series), _fig14(ctx, series)]
    md = "\n\n".join([
        scale_note(ctx) + f"DS 27B, MaxLen {max_len(ctx) // 1024}K, {num_agents(ctx)} agents (docs/paper.md §6.6 [I/S]); SNIC "
        "ratio: mean over 10 s windows with >= 20% mean SNIC read utilisation (`snic_max_over_avg`); whole-run ratio of "
        "bytes beside it.",
        md_table(["P/D", "scheduler", "SNIC Max/Avg (windows)", "SNIC Max/Avg (whole run)", "attention Max/Avg (first 5%)",
                  "attention Max/Avg (run)", "DE-path share of bytes", "JCT s"],
                 [[r["pd"], r["label"], r["snic_max_over_avg"], r["snic_max_over_avg_run"], r["attention_first_5pct"],
                   r["attention_whole_run"], r["de_path_share"], r["jct_s"]] for r in table]),
        "Round robin's alternating read side sends half the reads to one side's node(s) and half to the other's: on a "
        "3-node P/D the single node on one side gets 1/2 of the bytes against an average of 1/3, a Max/Avg of 1.5 by "
        "construction, whichever side it is on.",
        headline_table(headlines),
        "![Fig. 13](fig13.png)\n\n![Fig. 14](fig14.png)",
    ])
    return ExperimentOutput(NAME, TITLE, table, headlines, figs, md)


def _headlines(snic: dict[str, float], attention: float | None, runs: dict[str, str]) -> list[Headline]:
    """`snic`: mode -> SNIC Max/Avg on the headline P/D (a mode missing: no headline for it);
    `runs`: mode -> the run id of that simulation."""
    out = [Headline(NAME, f"SNIC Max/Avg, {label} ({HEADLINE_PD})", snic[mode], PAPER_SNIC[mode], TARGET,
                    note="target chosen here: the paper gives none",
                    by_construction=BY_CONSTRUCTION["round robin"] if mode != "dualpath" else "", runs=frozenset([runs[mode]]))
           for mode, label in MODES if mode in snic]
    if attention is not None:
        out.append(Headline(NAME, f"attention Max/Avg, DualPath, first 5% ({HEADLINE_PD})", attention, PAPER_ATTENTION, TARGET,
                            note="target chosen here: the paper gives none", by_construction=BY_CONSTRUCTION["attention"],
                            runs=frozenset([runs["dualpath"]])))
    return out


def _share(r: dict[str, Any]) -> float:
    b = r["bytes"]
    total = b["storage_to_prefill"] + b["storage_via_decode"]
    return b["storage_via_decode"] / total if total > 0 else float("nan")


def _fig13(ctx: Context, series: dict) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PDS), figsize=(6 * len(PDS), 3.4), squeeze=False)
    for ax, pd in zip(axes[0], PDS):
        for mode, label in MODES:
            w = series[(pd, mode)]["snic_windows"]
            pts = [(t, v) for t, v, u in zip(w["t_s"], w["max_over_avg"], w["mean_util"])
                   if v is not None and u is not None and u >= 0.2 and math.isfinite(v)]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], ".-", ms=2, lw=0.8, label=f"{label} (paper {PAPER_SNIC[mode]})")
        ax.axhline(1.0, color="grey", lw=0.8, ls=":")
        ax.set_title(f"DS 27B {pd}: storage NIC traffic Max/Avg per 10 s window", fontsize=9)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("Max / Avg")
        ax.legend(fontsize=7)
    fig.suptitle("Fig. 13: SNIC load balance (windows with >= 20% utilisation)")
    return save_figure(fig, ctx, "fig13.png")


def _fig14(ctx: Context, series: dict) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(PDS), figsize=(6 * len(PDS), 3.4), squeeze=False)
    for ax, pd in zip(axes[0], PDS):
        for mode, label in MODES:
            a = series[(pd, mode)]["attention"]
            ax.plot(a["t_s"], a["max_over_avg"], "-", lw=0.8, label=label)
        ax.axhline(PAPER_ATTENTION, color="k", ls="--", lw=0.8, label=f"paper, DualPath first 5% ({PAPER_ATTENTION})")
        ax.set_title(f"DS 27B {pd}: attention time Max/Avg in a PE group (10 s means)", fontsize=9)
        ax.set_xlabel("time (s)")
        ax.set_ylabel("Max / Avg")
        ax.legend(fontsize=7)
    fig.suptitle("Fig. 14: attention load balance")
    return save_figure(fig, ctx, "fig14.png")
