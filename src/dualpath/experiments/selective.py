"""Beyond the paper: decode-local prefill for short appends (`selective`, `dualpath+selective`;
core/policy/local.py) against basic and DualPath, and its threshold.

`selective` is the field's rule on a basic PD cluster (docs/paper.md §10): a request whose uncached
tokens are at most a threshold skips the prefill engines; its DE reads the hit through its own
node's SNIC, prefills the append in its decode steps and decodes. `dualpath+selective` is the same
rule on DualPath's scheduler (the other requests keep Algorithm 1, the two-phase DE selection and
the read-side rule).

Grid (`grid`), offline batches as Fig. 7 runs them (simrun.SimSpec, the paper presets): Fig. 7's
DeepSeek clusters, DS 660B on 2P4D (1,024 agents, Fig. 7's smallest count) and DS 27B on 1P1D (512,
Fig. 8's smallest), at every Table 2 MaxLen (32K, 48K, 64K); modes basic, dualpath, selective and
dualpath+selective at the default threshold (LOCAL_PREFILL_MAX_TOKENS_DEFAULT). The threshold
sweep (`THRESHOLDS`) runs both selective modes at 64K on both clusters. dualpath+selective reads a
local request's hit on its DE's node or, where a PE node's read queue is shorter, through that node
and over the CNICs (core/scheduler.py `_decided_local`); selective always on the DE's node.

Per run: JCT, TTFT p50 and p99, mean TPOT, the fraction of turns prefilled locally, bytes per read
path, and the most utilised of the PE nodes' SNIC reads, the DE nodes' SNIC reads and PE compute
(beyond.mode_metrics: a proxy for the binding resource).

The goal, evaluated per MaxLen point from these numbers (`goal`), not assumed: dualpath+selective's
JCT at most the better of dualpath's and selective's. No number of the paper is compared, so the
experiment has no headlines. Full scale: 48 simulations, ~5 minutes with two workers here (pure build).
Not part of the default suite (registry.OPT_IN): `dualpath repro --only selective --out DIR`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.policy.local import LOCAL_PREFILL_MAX_TOKENS_DEFAULT
from .beyond import mode_metrics, over_dualpath
from .common import MODE_COLORS, Context, ExperimentOutput, fmt, md_table, other_seeds, pyplot, ratio, save_figure, scale_note
from .simrun import SimSpec, simulate

NAME = "selective"
TITLE = "Beyond the paper: decode-local prefill for short appends"
MODES = ("basic", "dualpath", "selective", "dualpath+selective")
SELECTIVE_MODES = ("selective", "dualpath+selective")
COLORS = {**MODE_COLORS, "selective": "#8172b2", "dualpath+selective": "#dd8452"}
CLUSTERS = (("DS 660B", "ds-v3.2-660b", "2P4D", 1024), ("DS 27B", "ds-27b", "1P1D", 512))  # Fig. 7, Figs. 7-8's smallest counts
MAX_LENS = (32768, 49152, 65536)  # tokens: Table 2's MaxLens (docs/paper.md §4.2)
SWEEP_MAX_LEN = 65536  # the threshold sweep's MaxLen: the shortest appends (429 tokens, Table 2)
# choice: powers of two from half a block to 2,048 tokens, around Table 2's mean appends (429-608)
# and llm-d's 512 (docs/paper.md §10); the default (LOCAL_PREFILL_MAX_TOKENS_DEFAULT) is the one
# with the lowest dualpath+selective JCT here
THRESHOLDS = (32, 64, 128, 256, 512, 1024, 2048)


@dataclass(frozen=True, slots=True)
class Point:
    label: str
    model: str
    pd: str
    max_len_tokens: int
    num_agents: int

    @property
    def num_prefill_nodes(self) -> int:
        return int(self.pd.split("P")[0])

    def spec(self, mode: str, threshold: int = LOCAL_PREFILL_MAX_TOKENS_DEFAULT) -> SimSpec:
        knobs = () if threshold == LOCAL_PREFILL_MAX_TOKENS_DEFAULT else (f"scheduler.local_prefill_max_tokens={threshold}",)
        return SimSpec(self.model, self.pd, self.max_len_tokens, self.num_agents, mode, knobs=knobs)


def grid(ctx: Context) -> list[Point]:
    return [Point(f"{label} {pd} {n // 1024}K", model, pd, n, ctx.pick(agents, 16)) for label, model, pd, agents in CLUSTERS
            for n in ctx.pick(MAX_LENS, (32768, 65536))]


def _sweep_points(ctx: Context) -> list[Point]:
    return [p for p in grid(ctx) if p.max_len_tokens == SWEEP_MAX_LEN]


def planned(ctx: Context) -> list[SimSpec]:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    return ([p.spec(m) for p in grid(ctx) for m in MODES]
            + [p.spec(m, t) for p in _sweep_points(ctx) for m in SELECTIVE_MODES for t in THRESHOLDS
               if t != LOCAL_PREFILL_MAX_TOKENS_DEFAULT])


def run(ctx: Context) -> ExperimentOutput:
    table = [_row(p, {m: simulate(ctx, p.spec(m)) for m in MODES}) for p in grid(ctx)]
    recheck(ctx, table)
    sweep = [_sweep_row(ctx, p, table) for p in _sweep_points(ctx)]
    goals = {"num_points": len(table), "num_hold": sum(r["goal"]["holds"] for r in table)}
    figs = [_figure(ctx, sweep)]
    out = ExperimentOutput(NAME, TITLE, table, [], figs, _markdown(ctx, table, sweep, goals))
    out.extra.update({"goals": goals, "sweep": sweep, "default_threshold_tokens": LOCAL_PREFILL_MAX_TOKENS_DEFAULT})
    return out


def _metrics(result: dict[str, Any], num_prefill_nodes: int) -> dict[str, Any]:
    m = mode_metrics(result, num_prefill_nodes)
    m["local_fraction"] = result["scheduler"].get("local_prefills", 0) / max(1, result["num_turns"])
    return m


def _row(point: Point, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    modes = over_dualpath({m: _metrics(r, point.num_prefill_nodes) for m, r in results.items()})
    return {"point": point.label, "model": point.model, "pd": point.pd, "max_len": point.max_len_tokens,
            "agents": point.num_agents, "modes": modes, "goal": goal(modes),
            "runs": {m: point.spec(m).run_id() for m in results}}


def goal(modes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """dualpath+selective's JCT over the better of dualpath's and selective's: at most 1 holds (a NaN,
    an unfinished run, does not)."""
    better = min(modes["dualpath"]["jct_s"], modes["selective"]["jct_s"])
    over = ratio(modes["dualpath+selective"]["jct_s"], better)
    return {"jct_over_better": over, "holds": over <= 1.0}


def recheck(ctx: Context, table: list[dict[str, Any]]) -> None:
    """Each point whose goal fails gets `recheck`: the goal's ratio on common.RECHECK_SEEDS other
    workloads (seeds after the run's), in place; the verdict stays the run's seed's."""
    for point, row in zip(grid(ctx), table):
        if row["goal"]["holds"]:
            continue
        others = other_seeds(ctx)
        ratios = [goal({m: {"jct_s": simulate(o, point.spec(m))["jct_s"]} for m in MODES[1:]})["jct_over_better"]
                  for o in others]
        row["recheck"] = {"seeds": [o.seed for o in others], "jct_over_better": ratios,
                          "num_hold": sum(x <= 1.0 for x in ratios)}


def _sweep_row(ctx: Context, point: Point, table: list[dict[str, Any]]) -> dict[str, Any]:
    """Both selective modes at every threshold, each against dualpath at the same point."""
    dual = next(r for r in table if r["point"] == point.label)["modes"]["dualpath"]
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for m in SELECTIVE_MODES:
        rows = []
        for t in THRESHOLDS:
            x = _metrics(simulate(ctx, point.spec(m, t)), point.num_prefill_nodes)
            rows.append({"threshold_tokens": t, "jct_s": x["jct_s"], "ttft_p50_s": x["ttft_p50_s"],
                         "ttft_p99_s": x["ttft_p99_s"], "tpot_mean_s": x["tpot_mean_s"],
                         "local_fraction": x["local_fraction"], "jct_over_dualpath": ratio(x["jct_s"], dual["jct_s"]),
                         "ttft_p99_over_dualpath": ratio(x["ttft_p99_s"], dual["ttft_p99_s"]),
                         "binding": x["binding"], "run": point.spec(m, t).run_id()})
        by_mode[m] = rows
    return {"point": point.label, "agents": point.num_agents, "dualpath_jct_s": dual["jct_s"], "modes": by_mode}


def _markdown(ctx: Context, table: list[dict[str, Any]], sweep: list[dict[str, Any]], goals: dict[str, int]) -> str:
    rows = []
    for r in table:
        for m in MODES:
            x = r["modes"][m]
            rows.append([r["point"] if m == MODES[0] else "", m, x["jct_s"], x["jct_over_dualpath"], x["ttft_p50_s"],
                         x["ttft_p99_s"], x["tpot_mean_s"] * 1e3, x["local_fraction"]])
    sweep_rows = [[s["point"], m, x["threshold_tokens"], x["local_fraction"], x["jct_over_dualpath"],
                   x["ttft_p99_over_dualpath"], x["tpot_mean_s"] * 1e3] for s in sweep for m, xs in s["modes"].items() for x in xs]
    return "\n\n".join([
        scale_note(ctx) + f"Offline batches; threshold {LOCAL_PREFILL_MAX_TOKENS_DEFAULT} uncached tokens in the main "
        "grid. `x dualpath`: the mode's value over dualpath's; `local`: the fraction of turns prefilled on their DE.",
        md_table(["point", "mode", "JCT s", "JCT x dualpath", "TTFT p50 s", "TTFT p99 s", "TPOT ms", "local"], rows),
        f"Goal: dualpath+selective's JCT at most the better of dualpath's and selective's; holds on "
        f"**{goals['num_hold']} of {goals['num_points']}** points."
        + "".join(f" {r['point']} on seeds {r['recheck']['seeds'][0]}-{r['recheck']['seeds'][-1]}: "
                  + ", ".join(f"{x:.3f}" for x in r["recheck"]["jct_over_better"]) + "." for r in table if "recheck" in r),
        md_table(["point", "mode", "threshold", "local", "JCT x dualpath", "TTFT p99 x dualpath", "TPOT ms"], sweep_rows),
        "![threshold sweep](selective.png)",
    ])


def _figure(ctx: Context, sweep: list[dict[str, Any]]) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(2, max(1, len(sweep)), figsize=(4.5 * max(1, len(sweep)), 6.0), squeeze=False)
    for col, s in enumerate(sweep):
        for row, (key, title) in enumerate((("jct_over_dualpath", "JCT"), ("ttft_p99_over_dualpath", "TTFT p99"))):
            ax = axes[row][col]
            for m, xs in s["modes"].items():
                ax.plot([x["threshold_tokens"] for x in xs], [x[key] for x in xs], "-o", ms=3, color=COLORS[m], label=m)
            ax.axhline(1.0, color="k", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_xlabel("threshold, uncached tokens")
            ax.set_ylabel(f"{title} / dualpath's")
            ax.set_title(f"{s['point']}, {fmt(s['agents'])} agents", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Decode-local prefill: each selective mode over dualpath, by threshold (lower is better)")
    fig.tight_layout()
    return save_figure(fig, ctx, "selective.png")
