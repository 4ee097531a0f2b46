"""Beyond the paper: every mode on one grid, against basic, dualpath and the oracle.

The grid is the split-read experiment's (beyond.grid): Fig. 7's DeepSeek clusters (DS 660B 2P4D
and DS 27B 1P1D at 32K and 64K), Fig. 8's other P/D ratios of DS 27B (2P1D, 1P2D at 64K) and the
unbalanced clusters (DS 27B 2P1D and 1P1D with the PE nodes' SNICs at half rate, at 32K and 64K),
offline batches of 512 agents a point (beyond.agent_counts says why). Modes (`MODES`): the paper's
basic, dualpath and oracle, and each policy this project adds, at its default settings:
dualpath+split (core/policy/split.py), dualpath+tail (core/policy/tail.py), selective and
dualpath+selective (core/policy/local.py), basic+dram and dualpath+dram (core/dram.py, 256 GB a
node).

Per point and mode (beyond.mode_metrics): JCT, TTFT p50 and p99, mean TPOT, each over dualpath's;
bytes read from storage on each path and taken from the DRAM tiers; the binding resource (the most
utilised of the PE nodes' SNIC reads, the DE nodes' SNIC reads and PE compute). Per mode over the
grid: the geometric mean of its JCT and TTFT p99 over dualpath's and the points where it has the
lowest JCT of all modes but the oracle. The experiment judges no goal of its own (each policy's
goals are its own experiment's: beyond, selective, dram) and compares no number of the paper.
Full scale: 90 simulations, ~10 minutes with two workers here. Not part of the default suite
(registry.OPT_IN): `dualpath repro --only policies --out DIR --workers 2`.
"""

from __future__ import annotations

import math
from typing import Any

from .beyond import RESOURCES, GridPoint, grid, mode_metrics, over_dualpath
from .common import MODE_COLORS, Context, ExperimentOutput, md_table, pyplot, save_figure, scale_note
from .simrun import simulate

NAME = "policies"
TITLE = "Beyond the paper: every mode on one grid"
MODES = ("basic", "dualpath", "oracle", "dualpath+split", "dualpath+tail", "selective", "dualpath+selective",
         "basic+dram", "dualpath+dram")
POLICIES = tuple(m for m in MODES if m not in ("basic", "dualpath", "oracle"))
COLORS = {**MODE_COLORS, "dualpath+split": "#dd8452", "dualpath+tail": "#937860", "selective": "#8172b2",
          "dualpath+selective": "#da8bc3", "basic+dram": "#8c8c8c", "dualpath+dram": "#64b5cd"}


def planned(ctx: Context) -> list:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    return [p.spec(m) for p in grid(ctx) for m in MODES]


def run(ctx: Context) -> ExperimentOutput:
    table = [_row(p, {m: simulate(ctx, p.spec(m)) for m in MODES}) for p in grid(ctx)]
    summary = summarise(table)
    out = ExperimentOutput(NAME, TITLE, table, [], [_figure(ctx, table)], _markdown(ctx, table, summary))
    out.extra.update({"summary": summary, "modes": list(MODES)})
    return out


def _row(point: GridPoint, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    modes = over_dualpath({m: mode_metrics(r, point.num_prefill_nodes) for m, r in results.items()})
    real = {m: x["jct_s"] for m, x in modes.items() if m != "oracle"}
    return {"point": point.label, "model": point.model, "pd": point.pd, "max_len": point.max_len_tokens,
            "agents": point.num_agents, "unbalanced": point.unbalanced, "modes": modes,
            "best_jct_mode": min(real, key=lambda m: real[m]), "runs": {m: point.spec(m).run_id() for m in results}}


def summarise(table: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode: the geometric means of its JCT and TTFT p99 over dualpath's across the points, its
    worst JCT ratio, and the points where it has the lowest JCT but the oracle's."""
    out = {}
    for m in MODES:
        jct = [r["modes"][m]["jct_over_dualpath"] for r in table]
        p99 = [r["modes"][m]["ttft_p99_over_dualpath"] for r in table]
        out[m] = {"jct_over_dualpath_geomean": _geomean(jct), "ttft_p99_over_dualpath_geomean": _geomean(p99),
                  "jct_over_dualpath_max": max(jct, default=float("nan")),
                  "best_jct_points": [r["point"] for r in table if r["best_jct_mode"] == m]}
    return out


def _geomean(values: list[float]) -> float:
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    if len(finite) != len(values) or not finite:
        return float("nan")  # an unfinished run: no mean that hides it
    return math.exp(sum(math.log(v) for v in finite) / len(finite))


def _markdown(ctx: Context, table: list[dict[str, Any]], summary: dict[str, dict[str, Any]]) -> str:
    rows = [[m, s["jct_over_dualpath_geomean"], s["jct_over_dualpath_max"], s["ttft_p99_over_dualpath_geomean"],
             len(s["best_jct_points"])] for m, s in summary.items()]
    points = []
    for r in table:
        for m in MODES:
            x = r["modes"][m]
            points.append([r["point"] if m == MODES[0] else "", m, x["jct_s"], x["jct_over_dualpath"], x["ttft_p99_over_dualpath"],
                           x["tpot_mean_s"] * 1e3, x["pe_path_bytes"] / 1e9, x["de_path_bytes"] / 1e9, x["dram_bytes"] / 1e9,
                           RESOURCES[x["binding"]]])
    return "\n\n".join([
        scale_note(ctx) + "Offline batches; every mode of a point runs the same workload. `x dualpath`: over dualpath's; "
        "geometric means over the grid's points; `best`: points where the mode's JCT is the lowest but the oracle's.",
        md_table(["mode", "JCT x dualpath (geo. mean)", "JCT x dualpath (worst)", "TTFT p99 x dualpath (geo. mean)", "best"], rows),
        md_table(["point", "mode", "JCT s", "JCT x dualpath", "TTFT p99 x dualpath", "TPOT ms", "PE-path GB", "DE-path GB",
                  "DRAM GB", "binding"], points),
        "![every mode over dualpath](policies.png)",
    ])


def _figure(ctx: Context, table: list[dict[str, Any]]) -> str:
    """JCT and TTFT p99 over dualpath's, one row per mode and one column per point (log colour scale)."""
    import numpy as np
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(max(10.0, 1.6 * len(table)), 4.2), squeeze=False)
    labels = [r["point"].replace(" PE SNIC", "\nPE SNIC") for r in table]
    for ax, key, title in ((axes[0][0], "jct_over_dualpath", "JCT"), (axes[0][1], "ttft_p99_over_dualpath", "TTFT p99")):
        grid_values = np.array([[r["modes"][m][key] for r in table] for m in MODES], dtype=float)
        shown = np.log2(np.clip(grid_values, 1 / 8, 8))
        ax.imshow(shown, cmap="RdBu_r", vmin=-1.0, vmax=1.0, aspect="auto")
        for i in range(len(MODES)):
            for j in range(len(table)):
                ax.text(j, i, f"{grid_values[i, j]:.2f}", ha="center", va="center", fontsize=6)
        ax.set_yticks(range(len(MODES)), MODES, fontsize=7)
        ax.set_xticks(range(len(table)), labels, fontsize=6, rotation=60, ha="right")
        ax.set_title(f"{title} / dualpath's (blue: lower)", fontsize=9)
    fig.suptitle("Every mode over dualpath on the split-read grid (lower is better)")
    fig.tight_layout()
    return save_figure(fig, ctx, "policies.png")
