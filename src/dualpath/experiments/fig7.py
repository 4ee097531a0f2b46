"""Fig. 7 (docs/paper.md §6.1): offline JCT of a batch of agents launched together, per model (rows)
and MaxLen (columns), against the agent count; bars Ours, Ours(basic), Ours(oracle).

Agent counts: DS 660B uses the paper's 1024 / 2048 / 4096 [F] (read off its 64K panel; the other
panels' axes are [NF], so the same counts are used); DS 27B and Qwen 32B use Fig. 8's 512 / 1024 /
2048 [F] (the agent counts the paper uses for DS 27B).

Qwen 32B runs on the H200 preset: with DP only (docs/paper.md §5) its BF16 weights (65.5 GB) leave
6.5 GB of an 80 GB H800 for KV, less than one 32K trajectory (8.6 GB), so the paper's "Hopper"
GPUs must have had more HBM; H200 is the Hopper SKU with H800's compute and 141 GB [I].

SGL(MC) is not modelled: it is a different engine (SGLang + HiCache + Mooncake Store, TP = 8 for
Qwen, 1.5 TB DRAM) whose batching, transfer engine and cache tier the paper does not describe,
it was not run on DS 27B, it errors out on the large offline configurations ("N/A"), and the
paper reports gains only over Basic (docs/paper.md §5).
"""

from __future__ import annotations

from typing import Any, Iterator

from .common import (
    MODE_COLORS, MODE_LABELS, Context, ExperimentOutput, Headline, grouped_bars, headline_table, md_table, pyplot,
    ratio, row_runs, save_figure, scale_note, with_hardware_only,
)
from .simrun import SimSpec, hardware_only, simulate

NAME = "fig7"
TITLE = "Fig. 7: offline batch inference JCT"
MODES = ("dualpath", "basic", "oracle")
MODELS = (  # (label, model, P/D, gpu): docs/paper.md §5 defaults
    ("DS 27B", "ds-27b", "1P1D", None),
    ("DS 660B", "ds-v3.2-660b", "2P4D", None),
    ("Qwen 32B", "qwen2.5-32b", "1P2D", "h200"),
)
MAX_LENS = (32768, 49152, 65536)
PAPER_DS660B_64K = {1024: (5365.0, 2917.0, 1.84), 2048: (10052.0, 5365.0, 1.87), 4096: (19309.0, 10312.0, 1.87)}  # [F]
PAPER_DS27B_MAX_SPEEDUP = 1.78  # docs/paper.md §6.1 [P]
TARGET = 0.15
SGL_NOTE = (
    "SGL(MC) is not modelled: a different engine (SGLang + HiCache + Mooncake Store; TP = 8 for Qwen; "
    "1.5 TB DRAM per node) whose internals the paper does not describe; it was not run on DS 27B and errors "
    "out on large offline configurations; the paper itself reports gains only over Basic (docs/paper.md §5)."
)


def agent_counts(ctx: Context, model: str) -> tuple[int, ...]:
    if model == "ds-v3.2-660b":
        return ctx.pick((1024, 2048, 4096), (256,), (16,))
    if model == "qwen2.5-32b":
        return ctx.pick((512, 1024, 2048), (64,), (8,))
    return ctx.pick((512, 1024, 2048), (128,), (16,))


def max_lens(ctx: Context) -> tuple[int, ...]:
    return ctx.pick(MAX_LENS, MAX_LENS, (32768,))


def run(ctx: Context) -> ExperimentOutput:
    table = _rows(ctx, headline_only=False)
    # The headlines' runs again with every fitted knob at its hardware-only estimate (Basic and DualPath only)
    hw_table = _rows(ctx, headline_only=True)
    headlines = with_hardware_only(_headlines(ctx, table), _headlines(ctx, hw_table))
    fig = _figure(ctx, table)
    out = ExperimentOutput(NAME, TITLE, table, headlines, [fig], _markdown(ctx, table, headlines, hw_table))
    out.extra["hardware_only"] = hw_table
    return out


def planned(ctx: Context) -> list[SimSpec]:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    return [s for hw in (False, True) for _, specs in _cells(ctx, hw) for s in specs.values()]


def _cells(ctx: Context, headline_only: bool) -> Iterator[tuple[tuple[str, str, str, str | None, int, int], dict[str, SimSpec]]]:
    """((label, model, P/D, GPU, MaxLen, agents), mode -> spec) per bar group; `headline_only`: the
    headlines' panels (DS 660B at the largest MaxLen, every DS 27B panel), Basic and DualPath, with
    the hardware-only estimates."""
    modes = ("dualpath", "basic") if headline_only else MODES
    for label, model, pd, gpu in MODELS:
        if headline_only and model not in ("ds-v3.2-660b", "ds-27b"):
            continue
        for max_len in max_lens(ctx):
            if headline_only and model == "ds-v3.2-660b" and max_len != max(max_lens(ctx)):
                continue
            for n in agent_counts(ctx, model):
                specs = {m: SimSpec(model, pd, max_len, n, m, gpu=gpu) for m in modes}
                yield (label, model, pd, gpu, max_len, n), ({m: hardware_only(s) for m, s in specs.items()} if headline_only else specs)


def _rows(ctx: Context, headline_only: bool) -> list[dict[str, Any]]:
    """JCT rows of every panel (`_cells`)."""
    table: list[dict[str, Any]] = []
    for (label, model, pd, gpu, max_len, n), specs in _cells(ctx, headline_only):
        jct = {m: simulate(ctx, s)["jct_s"] for m, s in specs.items()}
        table.append({
            "model": model, "label": label, "pd": pd, "gpu": gpu or "h800", "max_len": max_len, "agents": n,
            **{f"jct_{m}_s": jct[m] for m in specs},
            "speedup": ratio(jct["basic"], jct["dualpath"]),
            "dualpath_over_oracle": ratio(jct["dualpath"], jct.get("oracle")),
            "runs": {m: s.run_id() for m, s in specs.items()},  # each mode's simulation (SimSpec.run_id)
        })
    return table


def _headlines(ctx: Context, table: list[dict[str, Any]]) -> list[Headline]:
    out = []
    ds660 = [r for r in table if r["model"] == "ds-v3.2-660b" and r["max_len"] == max(max_lens(ctx))]
    for r, (paper_n, (_, _, paper)) in zip(ds660, PAPER_DS660B_64K.items()):
        out.append(Headline(NAME, f"DS 660B {r['max_len'] // 1024}K speedup over basic @ {r['agents']} agents "
                                  f"(paper: {paper_n})", r["speedup"], paper, TARGET, source="[F]", runs=row_runs([r])))
    ds27 = [r for r in table if r["model"] == "ds-27b"]
    if ds27:  # the max over every panel rests on all of them
        out.append(Headline(NAME, "DS 27B max speedup over basic (all panels)", max(r["speedup"] for r in ds27),
                            PAPER_DS27B_MAX_SPEEDUP, TARGET, runs=row_runs(ds27)))
    return out


def _figure(ctx: Context, table: list[dict[str, Any]]) -> str:
    plt = pyplot()
    lens = max_lens(ctx)
    fig, axes = plt.subplots(len(MODELS), len(lens), figsize=(4.2 * len(lens), 3.2 * len(MODELS)), squeeze=False)
    for i, (label, model, pd, _) in enumerate(MODELS):
        for j, max_len in enumerate(lens):
            ax = axes[i][j]
            rows = [r for r in table if r["model"] == model and r["max_len"] == max_len]
            groups = [str(r["agents"]) for r in rows]
            grouped_bars(ax, groups, {m: [r[f"jct_{m}_s"] for r in rows] for m in MODES}, MODE_COLORS, MODE_LABELS)
            if model == "ds-v3.2-660b" and max_len == 65536:
                for k, r in enumerate(rows):
                    if r["agents"] in PAPER_DS660B_64K:
                        basic, ours, _ = PAPER_DS660B_64K[r["agents"]]
                        ax.plot([k - 0.27, k], [ours, basic], "k_", markersize=14, mew=2,
                                label="paper [F]" if k == 0 else None)
            ax.set_title(f"{label} {pd}, MaxLen {max_len // 1024}K", fontsize=9)
            ax.set_xlabel("agents")
            ax.set_ylabel("JCT (s)")
    axes[0][0].legend(fontsize=7, title="SGL(MC): not modelled", title_fontsize=6)
    fig.suptitle("Fig. 7: offline JCT (lower is better)")
    return save_figure(fig, ctx, "fig7.png")


def _markdown(ctx: Context, table: list[dict[str, Any]], headlines: list[Headline], hw_table: list[dict[str, Any]]) -> str:
    rows = [[r["label"], r["pd"], f"{r['max_len'] // 1024}K", r["agents"], r["jct_basic_s"], r["jct_dualpath_s"],
             r["jct_oracle_s"], r["speedup"], r["dualpath_over_oracle"]] for r in table]
    hw_rows = [[r["label"], r["pd"], f"{r['max_len'] // 1024}K", r["agents"], r["jct_basic_s"], r["jct_dualpath_s"],
                r["speedup"]] for r in hw_table if r["model"] == "ds-v3.2-660b"]
    paper_rows = [[n, b, o, s] for n, (b, o, s) in PAPER_DS660B_64K.items()]
    return "\n\n".join([
        scale_note(ctx) + "JCT in seconds; speedup = basic / dualpath. DS 660B on 2P4D, DS 27B on 1P1D, Qwen 32B on "
        "1P2D (docs/paper.md §5). Agent counts: DS 660B 1024/2048/4096 as the paper's 64K panel [F]; DS 27B and Qwen "
        "32B 512/1024/2048 as Fig. 8 (other panels' axes are [NF]). Qwen 32B runs on H200: with DP only, 80 GB "
        "H800s cannot hold its BF16 weights plus one 32K trajectory's KV [I].",
        md_table(["model", "P/D", "MaxLen", "agents", "basic", "dualpath", "oracle", "speedup", "dualpath/oracle"], rows),
        "Paper, DS 660B at 64K [F]:",
        md_table(["agents", "basic", "dualpath", "speedup"], paper_rows),
        headline_table(headlines),
        "DS 660B with every fitted knob at its hardware-only estimate (the prefill forward's fixed cost from "
        "the EP latency alone, without the Fig. 3 rule):",
        md_table(["model", "P/D", "MaxLen", "agents", "basic", "dualpath", "speedup"], hw_rows),
        "The paper: DS 27B is still 1.09-1.85x slower than Oracle (1P1D storage bandwidth) [P]; compare the "
        "dualpath/oracle column.",
        SGL_NOTE,
        "![Fig. 7](fig7.png)",
    ])
