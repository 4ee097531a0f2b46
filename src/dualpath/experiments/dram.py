"""Beyond the paper: a host-DRAM tier in front of storage (`+dram`, core/dram.py), its gain against
its capacity, with and without agents that wait for tools.

The paper says a DRAM cache layered on DualPath gives a "marginal" gain and does not measure it
(docs/paper.md §7, item 8); its SGL(MC) baseline ran with 1.5 TB of DRAM per node (§5). Here each
node keeps the Full Blocks that crossed its host memory (its reads, and a DE node's persists) in an
LRU of `ClusterConfig.dram_tier_gb_per_node`, reads only the rest through its SNIC, and the
read-side rule counts what each side holds (core/policy/read_side.py).

Grid (`grid`), offline batches as Fig. 7 runs them (simrun.SimSpec, the paper presets), at MaxLen
64K (Table 2's longest contexts, the most storage-bound): DS 660B on 2P4D with 1,024 agents and
DS 27B on 1P1D with 512 (Figs. 7-8's smallest counts), each with no tool time and with a
log-normal tool time of median TOOL_TIME_S (sigma 1, workloads/tool_time.py) between an agent's
rounds. Modes: basic and dualpath (no tier), basic+dram and dualpath+dram at every capacity of
CAPACITIES_GB (per node).

Per run: JCT, TTFT p50 and p99, mean TPOT, bytes per read path from storage and from DRAM, the
share of hit bytes DRAM served, and the most utilised of the PE nodes' SNIC reads, the DE nodes'
SNIC reads and PE compute (beyond.mode_metrics). The issue's question is answered by the table,
not by a goal: each +dram mode's JCT and TTFT p99 over its own mode without a tier, by capacity.
No number of the paper is compared, so the experiment has no headlines. Full scale: 40
simulations. Not part of the default suite (registry.OPT_IN): `dualpath repro --only dram --out DIR`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .beyond import mode_metrics
from .common import MODE_COLORS, Context, ExperimentOutput, fmt, md_table, pyplot, ratio, save_figure, scale_note
from .simrun import SimSpec, simulate

NAME = "dram"
TITLE = "Beyond the paper: a host-DRAM tier in front of storage"
BASE_MODES = ("basic", "dualpath")
DRAM_MODES = ("basic+dram", "dualpath+dram")
COLORS = {**MODE_COLORS, "basic+dram": "#8172b2", "dualpath+dram": "#dd8452"}
CLUSTERS = (("DS 660B", "ds-v3.2-660b", "2P4D", 1024), ("DS 27B", "ds-27b", "1P1D", 512))  # Figs. 7-8's smallest counts
MAX_LEN_TOKENS = 65536  # Table 2's longest (docs/paper.md §4.2): the largest working set
# choice: GB of tier per node, from a tenth of a DS 660B 1,024-agent working set per node
# (~3 TB in all at 48 KB a token, over 6 nodes) to more than all of it; 1,024 GB is near SGL(MC)'s
# 1.5 TB per node (docs/paper.md §5)
CAPACITIES_GB = (64, 256, 1024, 4096)
# choice: a median of a few seconds between an agent's rounds (the issue's "log-normal with a median
# of a few seconds"), sigma 1 as SimSpec's
TOOL_TIME_S = 4.0


@dataclass(frozen=True, slots=True)
class Point:
    label: str
    model: str
    pd: str
    num_agents: int
    tool_time_s: float

    @property
    def num_prefill_nodes(self) -> int:
        return int(self.pd.split("P")[0])

    def spec(self, mode: str, capacity_gb: int | None = None) -> SimSpec:
        knobs = () if capacity_gb is None else (f"cluster.dram_tier_gb_per_node={capacity_gb}",)
        return SimSpec(self.model, self.pd, MAX_LEN_TOKENS, self.num_agents, mode, knobs=knobs, tool_time_s=self.tool_time_s)


def grid(ctx: Context) -> list[Point]:
    return [Point(f"{label} {pd}{f', tool {t:g} s' if t else ''}", model, pd, ctx.pick(agents, 16), t)
            for label, model, pd, agents in CLUSTERS for t in (0.0, TOOL_TIME_S)]


def capacities(ctx: Context) -> tuple[int, ...]:
    return ctx.pick(CAPACITIES_GB, (64, 4096))


def planned(ctx: Context) -> list[SimSpec]:
    """Every run of `run`, known up front (suite.py runs them as one batch on a parallel executor)."""
    return ([p.spec(m) for p in grid(ctx) for m in BASE_MODES]
            + [p.spec(m, c) for p in grid(ctx) for m in DRAM_MODES for c in capacities(ctx)])


def run(ctx: Context) -> ExperimentOutput:
    table = [_row(ctx, p) for p in grid(ctx)]
    figs = [_figure(ctx, table)]
    out = ExperimentOutput(NAME, TITLE, table, [], figs, _markdown(ctx, table))
    out.extra.update({"capacities_gb_per_node": list(capacities(ctx)), "tool_time_median_s": TOOL_TIME_S})
    return out


def _metrics(result: dict[str, Any], num_prefill_nodes: int) -> dict[str, Any]:
    m = mode_metrics(result, num_prefill_nodes)
    m["dram_share"] = ratio(m["dram_bytes"], m["dram_bytes"] + m["pe_path_bytes"] + m["de_path_bytes"])
    return m


def _row(ctx: Context, point: Point) -> dict[str, Any]:
    """The point's two modes without a tier, and each +dram mode at every capacity over its own."""
    base = {m: _metrics(simulate(ctx, point.spec(m)), point.num_prefill_nodes) for m in BASE_MODES}
    tiers: dict[str, list[dict[str, Any]]] = {}
    for m in DRAM_MODES:
        own = base[m.removesuffix("+dram")]
        rows = []
        for c in capacities(ctx):
            x = _metrics(simulate(ctx, point.spec(m, c)), point.num_prefill_nodes)
            x.update({"capacity_gb": c, "jct_over_own": ratio(x["jct_s"], own["jct_s"]),
                      "ttft_p99_over_own": ratio(x["ttft_p99_s"], own["ttft_p99_s"]),
                      "jct_over_dualpath": ratio(x["jct_s"], base["dualpath"]["jct_s"]),
                      "run": point.spec(m, c).run_id()})
            rows.append(x)
        tiers[m] = rows
    return {"point": point.label, "model": point.model, "pd": point.pd, "agents": point.num_agents,
            "tool_time_s": point.tool_time_s, "modes": base, "tiers": tiers,
            "runs": {m: point.spec(m).run_id() for m in BASE_MODES}}


def _markdown(ctx: Context, table: list[dict[str, Any]]) -> str:
    rows = []
    for r in table:
        for m in BASE_MODES:
            x = r["modes"][m]
            rows.append([r["point"], m, "-", x["jct_s"], 1.0, ratio(x["jct_s"], r["modes"]["dualpath"]["jct_s"]),
                         x["ttft_p99_s"], 0.0, x["binding"]])
        for m, xs in r["tiers"].items():
            for x in xs:
                rows.append([r["point"], m, x["capacity_gb"], x["jct_s"], x["jct_over_own"], x["jct_over_dualpath"],
                             x["ttft_p99_s"], x["dram_share"], x["binding"]])
    return "\n\n".join([
        scale_note(ctx) + f"Offline batches at MaxLen {MAX_LEN_TOKENS // 1024}K. `x own`: JCT over the same mode "
        "without a tier; `DRAM share`: the hit bytes the tiers served instead of storage; `binding`: the most utilised "
        "of PE SNIC reads, DE SNIC reads and PE compute.",
        md_table(["point", "mode", "GB/node", "JCT s", "JCT x own", "JCT x dualpath", "TTFT p99 s", "DRAM share", "binding"], rows),
        "![DRAM tier by capacity](dram.png)",
    ])


def _figure(ctx: Context, table: list[dict[str, Any]]) -> str:
    plt = pyplot()
    fig, axes = plt.subplots(1, max(1, len(table)), figsize=(4.0 * max(1, len(table)), 3.4), squeeze=False)
    for col, r in enumerate(table):
        ax = axes[0][col]
        dual = r["modes"]["dualpath"]["jct_s"]
        for m in BASE_MODES:
            ax.axhline(ratio(r["modes"][m]["jct_s"], dual), color=COLORS[m], linewidth=0.9, linestyle="--", label=m)
        for m, xs in r["tiers"].items():
            ax.plot([x["capacity_gb"] for x in xs], [x["jct_over_dualpath"] for x in xs], "-o", ms=3, color=COLORS[m], label=m)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("DRAM tier, GB per node")
        ax.set_ylabel("JCT / dualpath's")
        ax.set_title(f"{r['point']}, {fmt(r['agents'])} agents", fontsize=9)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("A host-DRAM tier: JCT by capacity, over dualpath's without one (lower is better)")
    fig.tight_layout()
    return save_figure(fig, ctx, "dram.png")
