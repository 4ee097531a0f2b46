"""Beyond the paper: split reads (`dualpath+split`, core/policy/split.py) against DualPath, on the
clusters of Figs. 7 and 8 and on clusters whose two sides read at different rates.

Grid (`grid`), offline batches as Figs. 7 and 8 run them (`simrun.SimSpec`, the paper presets):
  - Fig. 7's DeepSeek clusters, DS 660B on 2P4D and DS 27B on 1P1D (fig7.MODELS), at MaxLen 32K
    and 64K;
  - Fig. 8's other P/D ratios of DS 27B, 2P1D and 1P2D, at its MaxLen, 64K (fig8.PDS, fig8.MAX_LEN);
  - unbalanced: DS 27B with the PE nodes' SNICs at half rate (`ClusterConfig.prefill_snic_scale`
    = 0.5), at 32K and 64K, on 2P1D (each PE node reads at half the DE node's rate, the two sides
    alike in total) and on 1P1D (the PE side also at half the DE side's total). DualPath's
    read-side rule (read_side.py) balances queued tokens, not seconds, so the slower side lags;
    the split cuts each hit by the two sides' rates;
  - the unbalanced clusters again with agents as they run outside a batch (`waiting_points`): each
    waits for its tools between rounds (log-normal, median WAITING_TOOL_TIME_S) and the agents
    arrive online (Poisson, WAITING_APS a second), so no start burst sets the tail and the read
    queues are mostly empty when a request is placed. An empty queue on both sides is a tie, which
    the read-side rule gives to the PE node: dualpath then reads most of the hit bytes through the
    half-rate PE SNICs, while a split reads each hit through both.
Modes: basic, dualpath, dualpath+split, oracle (config.parse_mode), all on one workload per point.
`grid` is the offline part, which experiments/policies.py runs every mode on; `points` adds the
waiting agents.

Per point and mode the table has JCT, TTFT p50 and p99, mean TPOT, bytes per read path (PE path:
storage -> PE node; DE path: storage -> DE node -> PE), each mode's ratio to dualpath, and the
most utilised of three resources over the run: the PE nodes' SNIC reads, the DE nodes' SNIC reads
(both as a fraction of each node's own rate, so a halved PE SNIC counts against its half) and the
PE GPUs' prefill compute. That is a proxy for the binding resource: one near 1 binds; several
well below 1 mean none does alone. The DE GPUs' busy fraction is listed but not ranked: it counts
time with any request decoding, near 1 in every offline run whatever binds.

The goals of split reads, evaluated per point from these numbers (`goal`), not assumed:
  1. on every point split's JCT is at most 1% over dualpath's (NO_REGRESSION_JCT_FRACTION);
  2. on an unbalanced point it also lowers JCT by at least 5% (UNBALANCED_JCT_GAIN_FRACTION) or
     TTFT p99 by at least 15% (UNBALANCED_TTFT_P99_GAIN_FRACTION).
A point over the line of goal 1 is run again on common.RECHECK_SEEDS other workloads (`recheck`),
whose ratios the table shows beside the verdict (which stays the run's seed's). The goals compare
with no number of the paper, so the experiment has no headlines and adds nothing to the report's
count of agreements with the paper.

Agent counts (`agent_counts`): 512 per point, Fig. 8's smallest count for DS 27B [F] and half of
Fig. 7's smallest for DS 660B, so that the full run's 56 simulations stay well within ~20 minutes
(the offline grid's 40 took 528 s of simulation here, serially, pure build; 3-30 s each, 64K runs
the longest: an agent runs ~157 turns at 64K, ~60 at 32K; the waiting agents' runs are as long).
Fig. 7's 1,024 to 4,096 agents would take 2-8 times as long. At 512 agents the reads carry load (the most utilised
resource reaches 0.8-0.95 on the 64K DS 27B points), but the paper's largest, most storage-bound
points are not reached. `--quick` runs 16 agents per point (~30 s in all;
tests/experiments/test_beyond_split_grid.py): too few to load any resource.

Not part of the default suite (registry.OPT_IN): `dualpath repro --only beyond --out DIR`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from . import fig7, fig8
from .common import (MODE_COLORS, Context, ExperimentOutput, fmt, grouped_bars, md_table, other_seeds, pyplot, ratio,
                     save_figure, scale_note)
from .simrun import SimSpec, simulate

NAME = "beyond"
TITLE = "Beyond the paper: split reads against DualPath"
BASELINE = "dualpath"
SPLIT = "dualpath+split"
MODES = ("basic", BASELINE, SPLIT, "oracle")
MODE_LABELS = {"basic": "basic", BASELINE: "dualpath", SPLIT: "dualpath+split", "oracle": "oracle"}
COLORS = {**MODE_COLORS, SPLIT: "#dd8452"}
MODELS = ("ds-v3.2-660b", "ds-27b")  # Fig. 7's DeepSeek rows (fig7.MODELS); Qwen 32B is not in the grid
MAX_LENS = (32768, 65536)  # tokens: two of Fig. 7's MaxLen panels (fig7.MAX_LENS)
# choice: an unbalanced cluster's PE-node SNIC rate as a fraction of the preset's, split reads' test
# bed (tests/sim/test_split_reads.py); 2P1D: sides alike in total, 1P1D: the PE side half the DE's
UNBALANCED_PE_SNIC_SCALE = 0.5
UNBALANCED = (("DS 27B", "ds-27b", "2P1D"), ("DS 27B", "ds-27b", "1P1D"))
# choice: agents that wait (module docstring): the tool-time sweep's longest median (seconds;
# docs/results/beyond/tool_time.yaml, workloads/tool_time.py: log-normal, sigma 1), and agents
# arriving at 1 a second, so that a point's 512 first turns spread over about 8.5 minutes
WAITING_TOOL_TIME_S = 5.0
WAITING_APS = 1.0
# choice: the goals of split reads (module docstring), as fractions of dualpath's value
NO_REGRESSION_JCT_FRACTION = 0.01
UNBALANCED_JCT_GAIN_FRACTION = 0.05
UNBALANCED_TTFT_P99_GAIN_FRACTION = 0.15
FIGURE_RATIO_CAP = 2.0  # the figure's axes end here (`_figure`)
RESOURCES = {"pe_snic_read": "PE SNIC", "de_snic_read": "DE SNIC", "pe_compute": "PE compute"}


@dataclass(frozen=True, slots=True)
class GridPoint:
    label: str  # model, P/D, MaxLen and the PE SNIC scale where not 1: the point's name in tables and JSON
    model: str
    pd: str
    max_len_tokens: int
    num_agents: int
    origin: str  # "fig7", "fig8", "unbalanced" or "unbalanced, waiting": which clusters and agents it comes from
    prefill_snic_scale: float = 1.0  # ClusterConfig.prefill_snic_scale
    tool_time_s: float = 0.0  # median tool time between an agent's rounds (0: back to back, offline)
    aps: float | None = None  # online: Poisson agent arrivals per second (None: every agent at t = 0)

    @property
    def unbalanced(self) -> bool:
        return self.prefill_snic_scale != 1.0

    @property
    def num_prefill_nodes(self) -> int:
        return int(self.pd.split("P")[0])

    def spec(self, mode: str) -> SimSpec:
        knobs = (f"cluster.prefill_snic_scale={self.prefill_snic_scale!r}",) if self.unbalanced else ()
        return SimSpec(self.model, self.pd, self.max_len_tokens, self.num_agents, mode, aps=self.aps, knobs=knobs,
                       tool_time_s=self.tool_time_s)


def agent_counts(ctx: Context, model: str) -> int:
    """Agents per point, the same for both models (module docstring: why these)."""
    return ctx.pick(512, 16)


def grid(ctx: Context) -> list[GridPoint]:
    """The grid points, each once, in table order (module docstring)."""
    points: list[GridPoint] = []
    for label, model, pd, _ in fig7.MODELS:
        if model in MODELS:
            points += [_point(ctx, label, model, pd, n, "fig7") for n in MAX_LENS]
    fig7_clusters = {(p.model, p.pd, p.max_len_tokens) for p in points}
    points += [_point(ctx, "DS 27B", fig8.MODEL, pd, fig8.MAX_LEN, "fig8") for pd in fig8.PDS
               if (fig8.MODEL, pd, fig8.MAX_LEN) not in fig7_clusters]
    points += [_point(ctx, label, model, pd, n, "unbalanced", UNBALANCED_PE_SNIC_SCALE)
               for label, model, pd in UNBALANCED for n in MAX_LENS]
    return points


def waiting_points(ctx: Context) -> list[GridPoint]:
    """The unbalanced clusters with agents that wait for tools and arrive online (module docstring)."""
    return [_point(ctx, label, model, pd, n, "unbalanced, waiting", UNBALANCED_PE_SNIC_SCALE, WAITING_TOOL_TIME_S,
                   WAITING_APS) for label, model, pd in UNBALANCED for n in MAX_LENS]


def points(ctx: Context) -> list[GridPoint]:
    """Every point of this experiment, in table order: the offline grid, then the waiting agents."""
    return grid(ctx) + waiting_points(ctx)


def _point(ctx: Context, label: str, model: str, pd: str, max_len: int, origin: str, scale: float = 1.0,
           tool_time_s: float = 0.0, aps: float | None = None) -> GridPoint:
    name = f"{label} {pd} {max_len // 1024}K" + (f" PE SNIC x{scale:g}" if scale != 1.0 else "")
    if aps is not None:
        name += f", {aps:g} agent/s, tools {tool_time_s:g} s"
    return GridPoint(name, model, pd, max_len, agent_counts(ctx, model), origin, scale, tool_time_s, aps)


def planned(ctx: Context) -> list[SimSpec]:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    return [p.spec(m) for p in points(ctx) for m in MODES]


def run(ctx: Context) -> ExperimentOutput:
    table = [_row(p, {m: simulate(ctx, p.spec(m)) for m in MODES}) for p in points(ctx)]
    recheck(ctx, table)
    goals = goal_counts(table)
    fig = _figure(ctx, table)
    out = ExperimentOutput(NAME, TITLE, table, [], [fig], _markdown(ctx, table, goals))
    out.extra.update({"goals": goals, "verdict": verdict(goals), "thresholds": {
        "no_regression_jct_fraction": NO_REGRESSION_JCT_FRACTION,
        "unbalanced_jct_gain_fraction": UNBALANCED_JCT_GAIN_FRACTION,
        "unbalanced_ttft_p99_gain_fraction": UNBALANCED_TTFT_P99_GAIN_FRACTION}})
    return out


def _row(point: GridPoint, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    modes = over_dualpath({m: mode_metrics(r, point.num_prefill_nodes) for m, r in results.items()})
    return {"point": point.label, "model": point.model, "pd": point.pd, "max_len": point.max_len_tokens,
            "agents": point.num_agents, "origin": point.origin, "prefill_snic_scale": point.prefill_snic_scale,
            "tool_time_s": point.tool_time_s, "aps": point.aps, "unbalanced": point.unbalanced, "modes": modes,
            "goal": goal(point.unbalanced, modes),
            "runs": {m: point.spec(m).run_id() for m in results}}


def recheck(ctx: Context, table: list[dict[str, Any]]) -> None:
    """Each point whose split JCT is over the no-regression line gets `recheck`: split's JCT over
    dualpath's on common.RECHECK_SEEDS other workloads (seeds after the run's), in place. The verdict
    stays the run's seed's; the other workloads say whether the rule or one agent's finish put it there."""
    for point, row in zip(points(ctx), table):
        if row["goal"]["no_regression"]:
            continue
        others = other_seeds(ctx)
        ratios = [ratio(simulate(o, point.spec(SPLIT))["jct_s"], simulate(o, point.spec(BASELINE))["jct_s"]) for o in others]
        row["recheck"] = {"seeds": [o.seed for o in others], "split_jct_over_dualpath": ratios,
                          "num_no_regression": sum(x <= 1 + NO_REGRESSION_JCT_FRACTION for x in ratios)}


def mode_metrics(result: dict[str, Any], num_prefill_nodes: int) -> dict[str, Any]:
    """One run's numbers for the table (sim/results.py keys); nodes [0, num_prefill_nodes) are the
    PE nodes (sim/simulator.py builds them first)."""
    snic = result["nic_utilisation"]["snic_read_by_node"]
    utilisation = {"pe_snic_read": _mean(snic[:num_prefill_nodes]), "de_snic_read": _mean(snic[num_prefill_nodes:]),
                   "pe_compute": result["gpu_busy"]["prefill_mean"]}
    return {
        "jct_s": result["jct_s"],
        "ttft_p50_s": result["ttft_s"]["p50"],
        "ttft_p99_s": result["ttft_s"]["p99"],
        "tpot_mean_s": result["tpot_s"]["mean"],
        "ttft_read_mean_s": result["ttft_breakdown_mean_s"]["read"],  # the hit's read, queue included
        "pe_path_bytes": result["bytes"]["storage_to_prefill"],
        "de_path_bytes": result["bytes"]["storage_via_decode"],
        # taken from the nodes' DRAM tiers instead of storage (`+dram`; 0 without one)
        "dram_bytes": result["bytes"].get("dram_to_prefill", 0.0) + result["bytes"].get("dram_via_decode", 0.0),
        "cached_tokens": result["cached_tokens"],
        "num_split_reads": result["scheduler"].get("split_reads", 0),
        "utilisation": utilisation,
        "de_busy": result["gpu_busy"]["decode_mean"],
        "binding": max(utilisation, key=lambda k: utilisation[k]),
    }


def over_dualpath(modes: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each mode's JCT, TTFT p50 and p99 and TPOT over dualpath's (`jct_over_dualpath`, ...), added in place."""
    base = modes[BASELINE]
    for metrics in modes.values():
        for key in ("jct_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s"):
            metrics[f"{key[:-2]}_over_dualpath"] = ratio(metrics[key], base[key])
    return modes


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def goal(unbalanced: bool, modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The goals' verdict at one point from its modes' ratios to dualpath (module docstring); a NaN
    ratio (a run that did not finish) meets no goal. `unbalanced_gain` is None on a balanced point."""
    jct, ttft_p99 = modes[SPLIT]["jct_over_dualpath"], modes[SPLIT]["ttft_p99_over_dualpath"]
    no_regression = jct <= 1 + NO_REGRESSION_JCT_FRACTION
    gain = None
    if unbalanced:
        gain = jct <= 1 - UNBALANCED_JCT_GAIN_FRACTION or ttft_p99 <= 1 - UNBALANCED_TTFT_P99_GAIN_FRACTION
    return {"split_jct_over_dualpath": jct, "split_ttft_p99_over_dualpath": ttft_p99, "no_regression": no_regression,
            "unbalanced_gain": gain, "holds": no_regression and gain is not False}


def goal_counts(table: Sequence[dict[str, Any]]) -> dict[str, int]:
    unbalanced = [r for r in table if r["unbalanced"]]
    return {"num_points": len(table), "num_hold": sum(r["goal"]["holds"] for r in table),
            "num_no_regression": sum(r["goal"]["no_regression"] for r in table),
            "num_unbalanced": len(unbalanced), "num_unbalanced_gain": sum(bool(r["goal"]["unbalanced_gain"]) for r in unbalanced)}


def verdict(goals: dict[str, int]) -> str:
    return (f"split-read goals hold on {goals['num_hold']} of {goals['num_points']} grid points: JCT within "
            f"{NO_REGRESSION_JCT_FRACTION:.0%} of dualpath on {goals['num_no_regression']} of {goals['num_points']}; "
            f"on the unbalanced ones, >= {UNBALANCED_JCT_GAIN_FRACTION:.0%} lower JCT or >= "
            f"{UNBALANCED_TTFT_P99_GAIN_FRACTION:.0%} lower TTFT p99 on {goals['num_unbalanced_gain']} of {goals['num_unbalanced']}")


def _gb(num_bytes: float) -> float:
    return num_bytes / 1e9


def _markdown(ctx: Context, table: list[dict[str, Any]], goals: dict[str, int]) -> str:
    rows = []
    for r in table:
        for m in MODES:
            x = r["modes"][m]
            rows.append([r["point"] if m == MODES[0] else "", r["agents"] if m == MODES[0] else "", m, x["jct_s"],
                         x["jct_over_dualpath"], x["ttft_p50_s"], x["ttft_p99_s"], x["ttft_p99_over_dualpath"],
                         x["tpot_mean_s"] * 1e3, _gb(x["pe_path_bytes"]), _gb(x["de_path_bytes"]),
                         f"{RESOURCES[x['binding']]} ({fmt(x['utilisation'][x['binding']], 2)})"])
    goal_rows = [[r["point"], r["unbalanced"], r["goal"]["split_jct_over_dualpath"], r["goal"]["split_ttft_p99_over_dualpath"],
                  r["modes"][SPLIT]["ttft_p50_over_dualpath"],
                  r["goal"]["no_regression"], "-" if r["goal"]["unbalanced_gain"] is None else r["goal"]["unbalanced_gain"],
                  "**holds**" if r["goal"]["holds"] else "**fails**", _recheck_cell(r)] for r in table]
    return "\n\n".join([
        scale_note(ctx) + "Offline batches on the clusters of Figs. 7 and 8 and on DS 27B 2P1D and 1P1D with the PE nodes' "
        f"SNICs at {UNBALANCED_PE_SNIC_SCALE:g}x (unbalanced); then the unbalanced clusters with agents that arrive "
        f"online ({WAITING_APS:g} a second) and wait for tools between rounds (median {WAITING_TOOL_TIME_S:g} s); "
        "every mode of a point runs the same workload. Times in seconds "
        "(TPOT in ms), bytes in GB (1e9); `x dualpath`: the mode's value over dualpath's; binding: the most utilised of "
        "the PE nodes' SNIC reads, the DE nodes' SNIC reads (each against its own rate) and PE compute, over the run.",
        md_table(["point", "agents", "mode", "JCT", "JCT x dualpath", "TTFT p50", "TTFT p99", "TTFT p99 x dualpath",
                  "TPOT ms", "PE-path GB", "DE-path GB", "binding (util.)"], rows),
        f"Goals of split reads: JCT at most {NO_REGRESSION_JCT_FRACTION:.0%} over dualpath's everywhere; on unbalanced "
        f"points also at least {UNBALANCED_JCT_GAIN_FRACTION:.0%} lower JCT or {UNBALANCED_TTFT_P99_GAIN_FRACTION:.0%} lower "
        f"TTFT p99. **{verdict(goals)}.**",
        md_table(["point", "unbalanced", "split JCT x dualpath", "split TTFT p99 x dualpath", "split TTFT p50 x dualpath",
                  "no regression", "unbalanced gain", "goal", "split JCT x dualpath, other seeds"], goal_rows),
        "![split reads against dualpath](beyond.png)",
    ])


def _recheck_cell(row: dict[str, Any]) -> str:
    r = row.get("recheck")
    if r is None:
        return "-"
    return ", ".join(f"{x:.3f}" for x in r["split_jct_over_dualpath"]) + f" (seeds {r['seeds'][0]}-{r['seeds'][-1]})"


def _figure(ctx: Context, table: list[dict[str, Any]]) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(max(8.0, 1.3 * len(table)), 10.0), squeeze=False)
    groups = [r["point"].replace(" PE SNIC", "\nPE SNIC").replace(", ", "\n") for r in table]
    for ax, key, title in ((axes[0][0], "jct_over_dualpath", "JCT"), (axes[1][0], "ttft_p50_over_dualpath", "TTFT p50"),
                           (axes[2][0], "ttft_p99_over_dualpath", "TTFT p99")):
        series = {m: [r["modes"][m][key] for r in table] for m in MODES}
        grouped_bars(ax, groups, series, COLORS, MODE_LABELS)
        ax.axhline(1.0, color="k", linewidth=0.8)
        finite = [v for vs in series.values() for v in vs if v == v]  # NaN (an unfinished run) drawn as 0
        # ratios near 1: the differences visible; basic's TTFT (up to x20) would flatten the rest, so
        # the axis stops at FIGURE_RATIO_CAP and a bar beyond it carries its value
        top = min(FIGURE_RATIO_CAP, max(finite, default=1.0) + 0.05)
        ax.set_ylim(bottom=max(0.0, min(finite, default=1.0) - 0.05), top=top)
        width = 0.8 / len(MODES)
        for i, m in enumerate(MODES):
            for g, v in enumerate(series[m]):
                if v == v and v > top:
                    ax.text(g + (i - (len(MODES) - 1) / 2) * width, top, f"{v:.1f}", ha="center", va="bottom", fontsize=6)
        ax.set_ylabel(f"{title} / dualpath's")
        ax.tick_params(axis="x", labelsize=7)
    axes[0][0].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle("Split reads: each mode's JCT and TTFT p50 / p99 over dualpath's (lower is better)")
    return save_figure(fig, ctx, "beyond.png")
