"""Figs. 10-11 (docs/paper.md §6.4): online serving. Agents arrive as a Poisson process at a given APS
and replay their 64K trajectories back to back; TTFT, TTST and TPOT against APS (Fig. 10), the
average trajectory JCT against APS (Fig. 11), and the largest APS that meets the SLO.

Method (a documented equivalent of the paper's stopping rule, see `simrun.meets_slo`):
- a fixed horizon T with a warm-up W; latencies over turns arriving in [W, T), counting turns still
  waiting at T with their TTFT so far (censored); means, as Table 3 reports;
- SLO met: every 150 s window's mean TTFT <= 4 s, the TTFT trend projected 30 min past T <= 4 s,
  mean TPOT <= 50 ms;
- W and T: DS 660B W = 1800 s (the paper's 30-minute comparison), T = 3600 s; DS 27B, whose agents
  live ~300 s at light load against DS 660B's ~800 s, W = 900 s, T = 1800 s;
- capacity: an APS grid (also the curves), then bisection between the last passing and the first
  failing grid point; the capacity is the largest passing APS seen;
- average trajectory JCT by Little's law (agents in the system / arrival rate over [W, T)).
MaxLen is [NF] for the online runs; 64K (Table 3's and the working-set analysis's dataset) is used.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .common import (
    MODE_COLORS, MODE_LABELS, Context, ExperimentOutput, Headline, finite_mean, headline_table, md_table, pyplot, ratio,
    save_figure, scale_note, with_hardware_only,
)
from .batch import simulate_many
from .simrun import TPOT_SLO_S, TTFT_SLO_S, SimSpec, hardware_only, meets_slo, online_spec

NAME = "fig10_11"
TITLE = "Figs. 10-11: online serving (APS sweep, capacity at the SLO)"
MODES = ("dualpath", "basic", "oracle")
PAPER_CAPACITY_RATIO = {"ds-27b": 1.67, "ds-v3.2-660b": 2.25}  # docs/paper.md §6.4 [P]
PAPER_MEAN_RATIO = 1.96  # the abstract's arithmetic mean [P]
TARGET = 0.25
LATENCY_NOTE = (
    "Latency curves against the paper's statements: TPOT is the same for all three systems (decode steps are "
    "HBM-bound and identical), as the paper finds for DS 660B; the paper's DS 27B TPOT gap between Basic/DualPath "
    "and Oracle (PD-transfer cost in small models) is not reproduced, because PD transfers and H2D copies do not "
    "slow decode steps in the model. TTST: ours is lower for DualPath than for Basic, because Basic (no layerwise "
    "prefill) moves the whole prompt KV PE -> DE after its last chunk while DualPath streams it layer by layer "
    "during prefill; the paper reports them alike."
)


@dataclass(frozen=True, slots=True)
class OnlineSetup:
    label: str
    model: str
    pd: str
    max_len: int
    warmup_s: float
    horizon_s: float
    grid: tuple[float, ...]
    bisect_steps: int
    hardware_only_knobs: bool = False  # every fitted knob at its hardware-only estimate

    def spec(self, mode: str, aps: float) -> SimSpec:
        spec = online_spec(self.model, self.pd, self.max_len, mode, round(aps, 6), self.horizon_s, self.warmup_s)
        return hardware_only(spec) if self.hardware_only_knobs else spec


def setups(ctx: Context) -> list[OnlineSetup]:
    return [
        OnlineSetup("DS 27B", "ds-27b", "1P1D", ctx.pick(65536, 65536, 32768), ctx.pick(900.0, 300.0, 120.0),
                    ctx.pick(1800.0, 900.0, 300.0), ctx.pick((0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.6), (0.4, 0.8, 1.2), (0.2, 0.8)),
                    ctx.pick(3, 1, 0)),
        ds660b_setup(ctx),
    ]


def ds660b_setup(ctx: Context) -> OnlineSetup:
    """Shared with Fig. 12 (breakdown) and Table 3 (2P4D at 0.4 APS), so their runs are cached."""
    return OnlineSetup("DS 660B", "ds-v3.2-660b", "2P4D", ctx.pick(65536, 65536, 32768), ctx.pick(1800.0, 600.0, 120.0),
                       ctx.pick(3600.0, 1200.0, 300.0), ctx.pick((0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.8), (0.2, 0.4, 0.6), (0.1, 0.4)),
                       ctx.pick(3, 1, 0))


Search = tuple[OnlineSetup, str]  # (setup, mode): one capacity search


def planned(ctx: Context) -> list[SimSpec]:
    """The runs of `run` known up front: every search's grid (the bisection steps depend on them)."""
    return [setup.spec(mode, aps) for setup, mode in _searches(ctx) for aps in setup.grid]


def _searches(ctx: Context) -> tuple[list[Search], list[Search]]:
    """The capacity searches of Figs. 10-11, then those behind the headlines again with every
    fitted knob at its hardware-only estimate."""
    hw_setups = [replace(s, hardware_only_knobs=True) for s in setups(ctx)]
    return [(s, m) for s in setups(ctx) for m in MODES] + [(s, m) for s in hw_setups for m in ("dualpath", "basic")]


def capacities(ctx: Context, searches: list[Search]) -> list[tuple[dict[str, Any], dict[float, dict[str, Any]]]]:
    """Per search: (largest APS meeting the SLO, APS -> result of every run). Grid, then bisection;
    the grids of all searches are one batch, then each bisection step of all of them (a search's
    steps depend only on its own runs, so the answers are those of one search at a time)."""
    specs = [setup.spec(mode, aps) for setup, mode in searches for aps in setup.grid]
    results = iter(simulate_many(ctx, specs))
    points = [{aps: next(results) for aps in setup.grid} for setup, _ in searches]
    brackets = [_bracket(setup, pts) for (setup, _), pts in zip(searches, points)]
    for step in range(max((setup.bisect_steps for setup, _ in searches), default=0)):
        live = [i for i, (setup, _) in enumerate(searches) if brackets[i] is not None and step < setup.bisect_steps]
        mids = [round(sum(brackets[i]) / 2, 6) for i in live]
        for i, mid, r in zip(live, mids, simulate_many(ctx, [searches[i][0].spec(searches[i][1], m) for i, m in zip(live, mids)])):
            points[i][mid] = r
            lo, hi = brackets[i]
            brackets[i] = (mid, hi) if meets_slo(r) else (lo, mid)
    caps = []
    for (setup, mode), pts, b in zip(searches, points, brackets):
        runs = sorted(setup.spec(mode, a).run_id() for a in pts)  # the capacity rests on every run of the search
        if b is None:
            caps.append({"aps": sorted(setup.grid)[-1], "bound": "lower", "steps": 0, "runs": runs})
        else:
            caps.append({"aps": b[0], "bound": "bracket" if b[0] > 0 else "upper", "fail_aps": b[1], "steps": setup.bisect_steps,
                         "runs": runs})
    return list(zip(caps, points))


def _bracket(setup: OnlineSetup, points: dict[float, dict[str, Any]]) -> tuple[float, float] | None:
    """(last passing APS below the first failing one, or 0; that first failing APS); None: all pass."""
    grid = sorted(setup.grid)
    ok = {a: meets_slo(points[a]) for a in grid}
    first_fail = next((a for a in grid if not ok[a]), None)
    if first_fail is None:
        return None
    passing = [a for a in grid if a < first_fail and ok[a]]
    return (passing[-1] if passing else 0.0), first_fail


def row(setup: OnlineSetup, mode: str, aps: float, r: dict[str, Any]) -> dict[str, Any]:
    on = r["probe"]["online"]
    return {"model": setup.model, "label": setup.label, "pd": setup.pd, "mode": mode, "aps": aps,
            "ttft_mean_s": on["ttft_mean_s"], "ttft_p90_s": on["ttft_p90_s"], "ttft_window_max_s": on["ttft_window_max_s"],
            "ttft_projected_s": on["ttft_projected_s"], "ttst_mean_s": on["ttst_mean_s"], "tpot_mean_s": on["tpot_mean_s"],
            "trajectory_jct_s": on["trajectory_jct_s"], "censored_turns": on["num_censored"], "turns": on["num_turns"],
            "meets_slo": meets_slo(r), "run": setup.spec(mode, aps).run_id()}


def run(ctx: Context) -> ExperimentOutput:
    table: list[dict[str, Any]] = []
    searches = _searches(ctx)
    found = dict(zip(searches, capacities(ctx, searches)))
    caps = {(setup.model, mode): found[(setup, mode)][0] for setup in setups(ctx) for mode in MODES}
    for setup in setups(ctx):
        for mode in MODES:
            points = found[(setup, mode)][1]
            table += [row(setup, mode, a, points[a]) for a in sorted(points)]
    cap_rows = _capacity_rows(setups(ctx), caps, MODES)
    hw_setups = [replace(s, hardware_only_knobs=True) for s in setups(ctx)]
    hw_caps = {(s.model, m): found[(s, m)][0] for s in hw_setups for m in ("dualpath", "basic")}
    hw_rows = _capacity_rows(hw_setups, hw_caps, ("dualpath", "basic"))
    headlines = with_hardware_only(_headlines(cap_rows), _headlines(hw_rows))
    figs = [_fig10(ctx, table), _fig11(ctx, table)]
    md = "\n\n".join([
        scale_note(ctx) + f"SLO: mean TTFT <= {TTFT_SLO_S:g} s in every 150 s window and projected 30 min past the "
        f"horizon, mean TPOT <= {TPOT_SLO_S * 1e3:g} ms (docs/paper.md §6.4; method in the module docstring). "
        + "; ".join(f"{s.label} {s.pd}: warm-up {s.warmup_s:g} s, horizon {s.horizon_s:g} s, grid {list(s.grid)}, "
                    f"{s.bisect_steps} bisection steps" for s in setups(ctx)) + ".",
        md_table(["model", "P/D", "dualpath APS", "basic APS", "oracle APS", "dualpath/basic", "paper"],
                 [[r["label"], r["pd"], r["capacity_dualpath_aps"], r["capacity_basic_aps"],
                   f"{r['capacity_oracle_aps']:.3g}{' (>=)' if r['capacity_oracle_bound'] == 'lower' else ''}", r["ratio"],
                   PAPER_CAPACITY_RATIO[r["model"]]] for r in cap_rows]),
        "Absolute APS capacities are [NF] in the paper; docs/paper.md §6.4 estimates DS 660B DualPath ~0.4-0.45 and Basic "
        "~0.2 [I]. The paper's claim is the ratio.",
        headline_table(headlines),
        "Capacities with every fitted knob at its hardware-only estimate (the same grid and bisection; `>=`: the "
        "grid's top passed):",
        md_table(["model", "P/D", "dualpath APS", "basic APS", "dualpath/basic"],
                 [[r["label"], r["pd"], f"{r['capacity_dualpath_aps']:.3g}{' (>=)' if r['capacity_dualpath_bound'] == 'lower' else ''}",
                   r["capacity_basic_aps"], r["ratio"]] for r in hw_rows]),
        LATENCY_NOTE,
        md_table(["model", "mode", "APS", "TTFT mean", "TTFT p90", "TTFT max window", "TTFT projected", "TTST", "TPOT",
                  "traj. JCT", "censored", "SLO"],
                 [[r["label"], r["mode"], r["aps"], r["ttft_mean_s"], r["ttft_p90_s"], r["ttft_window_max_s"],
                   r["ttft_projected_s"], r["ttst_mean_s"], r["tpot_mean_s"], r["trajectory_jct_s"], r["censored_turns"],
                   r["meets_slo"]] for r in table]),
        "![Fig. 10](fig10.png)\n\n![Fig. 11](fig11.png)",
    ])
    return ExperimentOutput(NAME, TITLE, table, headlines, figs, md, extra={"capacity": cap_rows, "hardware_only": hw_rows})


def _capacity_rows(setups_: list[OnlineSetup], caps: dict[tuple[str, str], dict[str, Any]],
                   modes: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = []
    for setup in setups_:
        c = {m: caps[(setup.model, m)] for m in modes}
        rows.append({"model": setup.model, "label": setup.label, "pd": setup.pd,
                     **{f"capacity_{m}_aps": c[m]["aps"] for m in modes},
                     **{f"capacity_{m}_bound": c[m]["bound"] for m in modes},
                     "ratio": ratio(c["dualpath"]["aps"], c["basic"]["aps"]),
                     "runs": sorted(set(c["dualpath"]["runs"]) | set(c["basic"]["runs"]))})  # the ratio's runs
    return rows


def _headlines(cap_rows: list[dict[str, Any]]) -> list[Headline]:
    headlines = [Headline(NAME, f"{r['label']} APS capacity at the SLO, dualpath / basic", r["ratio"],
                          PAPER_CAPACITY_RATIO[r["model"]], TARGET, runs=frozenset(r["runs"])) for r in cap_rows]
    headlines.append(Headline(NAME, "mean of the two capacity ratios", finite_mean([r["ratio"] for r in cap_rows]),
                              PAPER_MEAN_RATIO, TARGET, evidence="derived",
                              runs=frozenset(run for r in cap_rows for run in r["runs"])))
    return headlines


def _fig10(ctx: Context, table: list[dict[str, Any]]) -> str:
    plt = pyplot()
    labels = [s.label for s in setups(ctx)]
    fig, axes = plt.subplots(len(labels), 3, figsize=(12, 3.2 * len(labels)), squeeze=False)
    for i, label in enumerate(labels):
        for j, (key, name, slo) in enumerate((("ttft_mean_s", "TTFT (s)", TTFT_SLO_S), ("ttst_mean_s", "TTST (s)", None),
                                               ("tpot_mean_s", "TPOT (s)", TPOT_SLO_S))):
            ax = axes[i][j]
            for mode in MODES:
                rows = [r for r in table if r["label"] == label and r["mode"] == mode and (j == 0 or r["meets_slo"])]
                ax.plot([r["aps"] for r in rows], [r[key] for r in rows], "-o", ms=3, color=MODE_COLORS[mode], label=MODE_LABELS[mode])
            if slo is not None:
                ax.axhline(slo, ls="--", color="grey", lw=1)
            if j == 0:
                ax.set_ylim(0, 3 * TTFT_SLO_S)
            ax.set_title(f"{label}: {name.split()[0]}" + ("" if j == 0 else " (points within the SLO)"), fontsize=9)
            ax.set_xlabel("APS (agents / s)")
            ax.set_ylabel(name)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Fig. 10: online latency vs agent arrival rate (means)")
    return save_figure(fig, ctx, "fig10.png")


def _fig11(ctx: Context, table: list[dict[str, Any]]) -> str:
    plt = pyplot()
    labels = [s.label for s in setups(ctx)]
    fig, axes = plt.subplots(1, len(labels), figsize=(5 * len(labels), 3.4), squeeze=False)
    for ax, label in zip(axes[0], labels):
        for mode in MODES:
            rows = [r for r in table if r["label"] == label and r["mode"] == mode]
            ax.plot([r["aps"] for r in rows], [r["trajectory_jct_s"] for r in rows], "-o", ms=3, color=MODE_COLORS[mode],
                    label=MODE_LABELS[mode])
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("APS (agents / s)")
        ax.set_ylabel("average trajectory JCT (s)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Fig. 11: average trajectory JCT vs APS (Little's law over [warm-up, horizon))")
    return save_figure(fig, ctx, "fig11.png")
