"""Fig. 8 (docs/paper.md §6.3): P/D ratio. DS 27B offline JCT on 1P1D, 2P1D and 1P2D with 512, 1024
and 2048 agents [F], Basic and DualPath. MaxLen is [NF]; 64K, the dataset of the paper's
motivation trace and of its DS 660B experiments, is used.

Pairs the paper calls alike, because each pair has the same usable storage bandwidth (Basic reads
only through PE-node SNICs, DualPath through all): Basic 1P1D ~ Basic 1P2D, DualPath 1P1D ~ Basic
2P1D, DualPath 2P1D ~ DualPath 1P2D.
"""

from __future__ import annotations

from typing import Any

from .common import (
    MODE_COLORS, Context, ExperimentOutput, Headline, finite_mean, grouped_bars, headline_table, md_table, pyplot, ratio,
    row_runs, save_figure, scale_note, with_hardware_only,
)
from .simrun import SimSpec, hardware_only, simulate

NAME = "fig8"
TITLE = "Fig. 8: P/D ratio (DS 27B)"
MODEL = "ds-27b"
PDS = ("1P1D", "2P1D", "1P2D")
MODES = ("basic", "dualpath")
MAX_LEN = 65536
PAIRS = ((("1P1D", "basic"), ("1P2D", "basic")), (("1P1D", "dualpath"), ("2P1D", "basic")),
         (("2P1D", "dualpath"), ("1P2D", "dualpath")))
PAPER_MEAN_SPEEDUP, PAPER_MAX_SPEEDUP = 1.64, 2.46  # docs/paper.md §6.3 [P]
PAIR_TARGET, SPEEDUP_TARGET = 0.10, 0.20


def agent_counts(ctx: Context) -> tuple[int, ...]:
    return ctx.pick((512, 1024, 2048), (128,), (16,))


def max_len(ctx: Context) -> int:
    return ctx.pick(MAX_LEN, MAX_LEN, 32768)


def run(ctx: Context) -> ExperimentOutput:
    table, pairs = _runs(ctx, hardware_only_knobs=False)
    hw_table, hw_pairs = _runs(ctx, hardware_only_knobs=True)  # every run is behind a headline
    headlines = with_hardware_only(_headlines(table, pairs), _headlines(hw_table, hw_pairs))
    fig = _figure(ctx, table)
    md = "\n\n".join([
        scale_note(ctx) + f"DS 27B, MaxLen {max_len(ctx) // 1024}K (Fig. 8's MaxLen is [NF]); JCT in seconds.",
        md_table(["P/D", "agents", "basic", "dualpath", "speedup"],
                 [[r["pd"], r["agents"], r["jct_basic_s"], r["jct_dualpath_s"], r["speedup"]] for r in table]),
        "Pairs with the same usable storage bandwidth (paper: alike):",
        md_table(["agents", "A", "B", "JCT A", "JCT B", "A/B"],
                 [[p["agents"], p["a"], p["b"], p["jct_a_s"], p["jct_b_s"], p["a_over_b"]] for p in pairs]),
        headline_table(headlines),
        "![Fig. 8](fig8.png)",
    ])
    return ExperimentOutput(NAME, TITLE, table, headlines, [fig], md, extra={"pairs": pairs, "hardware_only": hw_table})


def planned(ctx: Context) -> list[SimSpec]:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    return [_spec(ctx, pd, m, n, hw) for hw in (False, True) for n in agent_counts(ctx) for pd in PDS for m in MODES]


def _spec(ctx: Context, pd: str, mode: str, n: int, hardware_only_knobs: bool) -> SimSpec:
    spec = SimSpec(MODEL, pd, max_len(ctx), n, mode)
    return hardware_only(spec) if hardware_only_knobs else spec


def _runs(ctx: Context, hardware_only_knobs: bool) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(JCT rows, alike pairs); `hardware_only_knobs`: every fitted knob at its hardware-only estimate."""
    jct: dict[tuple[str, str, int], float] = {}
    run: dict[tuple[str, str, int], str] = {}  # SimSpec.run_id of each simulation
    table: list[dict[str, Any]] = []
    for n in agent_counts(ctx):
        for pd in PDS:
            for m in MODES:
                spec = _spec(ctx, pd, m, n, hardware_only_knobs)
                jct[(pd, m, n)], run[(pd, m, n)] = simulate(ctx, spec)["jct_s"], spec.run_id()
            table.append({"pd": pd, "agents": n, "jct_basic_s": jct[(pd, "basic", n)],
                          "jct_dualpath_s": jct[(pd, "dualpath", n)],
                          "speedup": ratio(jct[(pd, "basic", n)], jct[(pd, "dualpath", n)]),
                          "runs": {m: run[(pd, m, n)] for m in MODES}})
    pairs = []
    for n in agent_counts(ctx):
        for a, b in PAIRS:
            pairs.append({"agents": n, "a": f"{a[1]} {a[0]}", "b": f"{b[1]} {b[0]}",
                          "jct_a_s": jct[(*a, n)], "jct_b_s": jct[(*b, n)], "a_over_b": ratio(jct[(*a, n)], jct[(*b, n)]),
                          "runs": [run[(*a, n)], run[(*b, n)]]})
    return table, pairs


def _headlines(table: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> list[Headline]:
    speedups = [r["speedup"] for r in table]
    headlines = [Headline(NAME, f"{p['a']} / {p['b']} JCT @ {p['agents']} agents (alike)", p["a_over_b"], 1.0, PAIR_TARGET,
                          runs=frozenset(p["runs"])) for p in pairs]
    # the mean and the max are statistics of every run (not of the pair headlines): simulated, on all of them
    return headlines + [
        Headline(NAME, "mean speedup over basic (all P/D and agent counts)", finite_mean(speedups), PAPER_MEAN_SPEEDUP, SPEEDUP_TARGET,
                 runs=row_runs(table)),
        Headline(NAME, "max speedup over basic", max(speedups), PAPER_MAX_SPEEDUP, SPEEDUP_TARGET,
                 note="target 20% as for the mean (the paper gives none)", runs=row_runs(table))]


def _figure(ctx: Context, table: list[dict[str, Any]]) -> str:
    plt = pyplot()
    counts = agent_counts(ctx)
    fig, axes = plt.subplots(1, len(counts), figsize=(4.2 * len(counts), 3.4), squeeze=False)
    for ax, n in zip(axes[0], counts):
        rows = [r for r in table if r["agents"] == n]
        grouped_bars(ax, [r["pd"] for r in rows], {m: [r[f"jct_{m}_s"] for r in rows] for m in MODES}, MODE_COLORS,
                     {"basic": "Basic", "dualpath": "DualPath"})
        ax.set_title(f"{n} agents", fontsize=9)
        ax.set_ylabel("JCT (s)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Fig. 8: DS 27B JCT by P/D ratio")
    return save_figure(fig, ctx, "fig8.png")
