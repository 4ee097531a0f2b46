"""Run experiments and assemble DIR/report.md and DIR/summary.json.

Each experiment writes DIR/<name>.json (its table, headlines, figures, report section and wall
time) as soon as it finishes; report.md and summary.json are then rebuilt from every
DIR/<name>.json of the same scale and seed, so `--only NAME` refreshes one section of an earlier
full report, and an interrupted suite keeps what it finished.

On a parallel executor (`--ray`) the experiments' `planned(ctx)` runs go out first, as one batch
(batch.py); the experiments then run as before, reading those results from the memo.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import InputError
from ..sim.runner import write_json
from .batch import prefetch
from .common import EVIDENCE, Context, ExperimentOutput, Headline, headline_table, md_table
from .knobs import all_knob_rows, calibration_sentence, knob_count_sentence, knob_counts, knobs_markdown
from .registry import ALL, EXPERIMENTS
from .simrun import code_fingerprint


def resolve_names(only: Sequence[str] | None) -> list[str]:
    """Registry order; none: the default suite (registry.EXPERIMENTS), without the opt-in ones;
    `only` entries may be comma-separated; unknown names raise InputError."""
    if not only:
        return list(EXPERIMENTS)
    wanted = [w.strip() for item in only for w in item.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in ALL]
    if unknown or not wanted:
        raise InputError(f"unknown experiment {', '.join(map(repr, unknown)) or '(empty)'}: choose from {', '.join(ALL)}")
    return [n for n in ALL if n in wanted]


def run_suite(ctx: Context, names: Sequence[str]) -> list[ExperimentOutput]:
    if ctx.out_dir.exists() and not ctx.out_dir.is_dir():
        raise InputError(f"--out {ctx.out_dir} exists and is not a directory")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    # On a parallel executor, every run the experiments know up front goes out as one batch; the
    # experiments then read them from the memo (adaptive steps follow as batches of their own).
    prefetch(ctx, [spec for name in names for spec in getattr(ALL[name], "planned", lambda _: [])(ctx)])
    outputs = []
    for name in names:
        module = ALL[name]
        ctx.progress.start_experiment(name)
        ctx.sim_wall_s = {}
        ctx.sim_build = {}
        t0 = time.perf_counter()
        out = module.run(ctx)
        out.wall_s = time.perf_counter() - t0
        out.sim_wall_s = sum(ctx.sim_wall_s.values())
        out.num_sims = len(ctx.sim_wall_s)
        out.sim_builds = sorted(set(ctx.sim_build.values()))
        ctx.progress.end_experiment(name, out.wall_s)
        write_json({**out.to_json(), "markdown": out.markdown, "scale": ctx.scale, "seed": ctx.seed,
                    "simulator_code": code_fingerprint()}, ctx.out_dir / f"{name}.json")
        outputs.append(out)
        write_report(ctx)
    return outputs


def _load_sections(ctx: Context) -> list[dict[str, Any]]:
    sections = []
    for name in ALL:
        path = ctx.out_dir / f"{name}.json"
        if not path.is_file():
            continue
        data = json.loads(path.read_text())
        if data.get("scale") == ctx.scale and data.get("seed") == ctx.seed:
            sections.append(data)
    return sections


def write_report(ctx: Context) -> None:
    sections = _load_sections(ctx)
    headlines = [h for s in sections for h in s["headlines"]]
    objects = [Headline.from_dict(h) for h in headlines]
    agreements = independent_agreements(objects)
    summary = {
        "scale": ctx.scale,
        "seed": ctx.seed,
        # the code that ran the sections' simulations (a report rebuilt later keeps theirs)
        "simulator_code": ", ".join(sorted({s.get("simulator_code", "unrecorded") for s in sections})),
        "experiments": {s["name"]: {"wall_s": s["wall_s"], "sim_wall_s": s.get("sim_wall_s"), "num_sims": s.get("num_sims"),
                                    "sim_builds": s.get("sim_builds", []), **_counts(s["headlines"]),
                                    **_agreement_counts([a for a in agreements if a.headlines[0].experiment == s["name"]])}
                        for s in sections},
        "wall_s_total": sum(s["wall_s"] for s in sections),
        "counts": {**_counts(headlines), **_agreement_counts(agreements), "knobs": knob_counts()},
        "headlines": headlines,
        "knobs": [k.to_dict() for k in all_knob_rows()],
    }
    write_json(summary, ctx.out_dir / "summary.json")
    counts_as = _counts_as(objects, agreements)
    (ctx.out_dir / "report.md").write_text(_report_markdown(ctx, sections, summary, agreements, counts_as))


@dataclass(frozen=True, slots=True)
class Agreement:
    """One independent agreement with the paper: the simulations a headline brought first
    (`runs`), and the headlines that rest on them (`headlines`, that one first)."""

    headlines: tuple[Headline, ...]
    runs: frozenset[str]

    @property
    def met(self) -> bool:
        """Met when every headline in it is: comparing the same simulations with the paper once
        more can take an agreement away, never add one."""
        return all(h.met for h in self.headlines)


def independent_agreements(headlines: Sequence[Headline]) -> list[Agreement]:
    """The independent agreements among `headlines` (in report order): what the report counts.

    Only simulated headlines that count (not met by construction) take part: an arithmetic check
    rests on no simulation and a derived value on other headlines, so neither is an agreement;
    nor is a simulated headline without recorded runs (`unidentified` in summary.json). In order, a
    headline with a run that no agreement holds yet opens one with all its runs; a headline
    whose runs are all held joins every agreement holding one of them. So headlines on the same
    simulations, or on a subset of those already counted (Fig. 9's x1 is Fig. 7's 1,024-agent
    run), are one agreement, and a miss among them makes it missed."""
    built: list[tuple[list[Headline], set[str]]] = []
    held: set[str] = set()
    for h in headlines:
        if h.evidence != "simulated" or not h.counted or not h.runs:
            continue
        if h.runs <= held:
            for members, runs in built:
                if runs & h.runs:
                    members.append(h)
        else:
            built.append(([h], set(h.runs)))
            held |= h.runs
    return [Agreement(tuple(members), frozenset(runs)) for members, runs in built]


def _agreement_counts(agreements: Sequence[Agreement]) -> dict[str, int]:
    return {"independent": len(agreements), "independent_met": sum(a.met for a in agreements)}


def _counts(headlines: list[dict[str, Any]]) -> dict[str, int]:
    """Headlines counted as agreement with the paper (not met by construction), met, met by
    construction; of those counted, each evidence's number and met (EVIDENCE), and simulated ones
    without recorded runs; of those with a hardware-only value, how many it meets."""
    counted = [h for h in headlines if not h.get("by_construction")]
    with_hw = [h for h in counted if h.get("hardware_only_met") is not None]
    by_evidence = {e: [h for h in counted if h.get("evidence", "simulated") == e] for e in EVIDENCE}
    return {"headlines": len(counted), "met": sum(1 for h in counted if h["met"]),
            "by_construction": len(headlines) - len(counted),
            **{k: v for e, hs in by_evidence.items() for k, v in ((e, len(hs)), (f"{e}_met", sum(1 for h in hs if h["met"])))},
            "unidentified": sum(1 for h in by_evidence["simulated"] if not h.get("runs")),
            "hardware_only_simulated": len(with_hw), "hardware_only_met": sum(1 for h in with_hw if h["hardware_only_met"]),
            "fitted_without_hardware_only": sum(1 for h in counted if h.get("fitted") and h.get("hardware_only") is None)}


def _headline_sentence(c: dict[str, Any]) -> str:
    """The report's count: headlines, what they are, the independent agreements, the knobs."""
    unidentified = (f" ({c['unidentified']} simulated headlines carry no runs, written before runs were recorded: "
                    "rerun their experiments)" if c["unidentified"] else "")
    return (f"**{c['met']} of {c['headlines']} headlines met**, not counting {c['by_construction']} met by construction "
            f"([listed apart](#by-construction)): {c['simulated_met']} of {c['simulated']} simulated, "
            f"{c['arithmetic_met']} of {c['arithmetic']} arithmetic checks of the cost model (no simulation), "
            f"{c['derived_met']} of {c['derived']} derived from other headlines. The simulated ones rest on "
            f"{c['independent']} distinct sets of simulations: **{c['independent_met']} of {c['independent']} independent "
            f"agreements met** ([how they are counted](#independent)){unidentified}. Behind the simulations: "
            f"{knob_count_sentence()}.")


def _report_markdown(ctx: Context, sections: list[dict[str, Any]], summary: dict[str, Any],
                     agreements: list[Agreement], counts_as: list[str]) -> str:
    c, headlines = summary["counts"], summary["headlines"]
    lines = [
        "# DualPath: the paper's experiments in the simulator",
        "",
        f"Generated by `dualpath repro{' --quick' if ctx.scale == 'quick' else ''}` (scale `{ctx.scale}`, seed {ctx.seed}). "
        "Every number of the paper carries its docs/paper.md provenance tag ([P] text, [F] pixel reading, [I] inference); "
        "rel. error = ours / paper - 1. Simulator knobs are the presets of `dualpath.config` and the workload "
        "generator's parameters, listed with their kind and source under [Calibration knobs](#knobs).",
        "",
        _headline_sentence(c),
        "",
        calibration_sentence() + " With every such knob at its hardware-only estimate: "
        f"{c['hardware_only_met']} of the {c['hardware_only_simulated']} headlines simulated that way met"
        + (f" ({c['fitted_without_hardware_only']} without a hardware-only value, see their notes)." if c["fitted_without_hardware_only"] else "."),
        "",
        "Wall times: `this run` is this invocation's (small when its simulations came from DIR/cache); "
        "`simulations` sums the wall time of the experiment's simulations when they were first run (a run "
        "shared by several experiments counts in each). Both on the machine that ran them. `build` is the "
        "simulator build that ran the simulations (`pure` Python or `compiled` with mypyc, `make compiled`): "
        "it changes wall times only, never a simulated number. `independent`: the agreements its headlines open "
        "(met / opened).",
        "",
        "| experiment | wall s (this run) | simulations | simulation wall s | build | headlines met | independent |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in sections:
        e = summary["experiments"][s["name"]]
        built = f" (+{e['by_construction']} by construction)" if e["by_construction"] else ""
        lines.append(f"| [{s['name']}](#{s['name']}) | {s['wall_s']:.0f} | {s.get('num_sims', 0)} | "
                     f"{s.get('sim_wall_s', 0.0):.0f} | {', '.join(s.get('sim_builds', [])) or '-'} | "
                     f"{e['met']} / {e['headlines']}{built} | {e['independent_met']} / {e['independent']} |")
    counted = [(h, k) for h, k in zip(headlines, counts_as) if not h.get("by_construction")]
    lines += ["", "## All headlines", "", _headlines_md([h for h, _ in counted], [k for _, k in counted]), "",
              "<a id=\"independent\"></a>", "## Independent agreements", "", _agreements_md(agreements), "",
              "<a id=\"by-construction\"></a>", "## Met by construction (not counted)", "",
              "These agree with the paper because of how the simulator or the experiment is built, not because the "
              "simulator reproduces the testbed; they are not counted above.", "", _by_construction_md(headlines), ""]
    for s in sections:
        lines += [f"<a id=\"{s['name']}\"></a>", f"## {s['title']}", "",
                  f"Wall time: {s['wall_s']:.0f} s this run; {s.get('num_sims', 0)} simulations, "
                  f"{s.get('sim_wall_s', 0.0):.0f} s when first simulated.", "", s["markdown"], ""]
    lines += ["<a id=\"knobs\"></a>", "## Calibration knobs", "", knobs_markdown(), ""]
    return "\n".join(lines)


def _label(h: Headline) -> str:
    return f"{h.experiment}: {h.metric}"


def _counts_as(headlines: list[Headline], agreements: Sequence[Agreement]) -> list[str]:
    """Per headline (the objects `agreements` was built from), what it counts as: its evidence,
    the agreement it opens, or those it joins; "" for one met by construction."""
    where: dict[int, list[int]] = {}
    for n, a in enumerate(agreements, 1):
        for h in a.headlines:
            where.setdefault(id(h), []).append(n)
    out = []
    for h in headlines:
        numbers = where.get(id(h), [])
        if h.by_construction:
            out.append("")
        elif h.evidence != "simulated":
            out.append(h.evidence)
        elif not numbers:
            out.append("not counted (no runs recorded)")
        else:
            opens = any(agreements[n - 1].headlines[0] is h for n in numbers)
            out.append(f"#{numbers[0]}" if opens else "same runs as " + ", ".join(f"#{n}" for n in numbers))
    return out


def _agreements_md(agreements: Sequence[Agreement]) -> str:
    rule = (independent_agreements.__doc__ or "").split("\n\n", 1)[1]
    rows = [[f"#{n}", _label(a.headlines[0]), len(a.runs), "; ".join(_label(h) for h in a.headlines[1:]) or "-",
             "**met**" if a.met else "**missed**"] for n, a in enumerate(agreements, 1)]
    return (" ".join(line.strip() for line in rule.splitlines()) + " (`dualpath.experiments.suite.independent_agreements`; "
            "a run is one simulation, `SimSpec.run_id`, listed in each headline's `runs` in summary.json.)\n\n"
            + md_table(["#", "opened by", "simulations", "also resting on them", "result"], rows))


def _prefixed(h: dict[str, Any]) -> Headline:
    return Headline.from_dict({**h, "metric": f"{h['experiment']}: {h['metric']}"})


def _headlines_md(headlines: list[dict[str, Any]], counts_as: list[str]) -> str:
    table = headline_table([_prefixed(h) for h in headlines], counts_as)
    notes = [f"- {h['experiment']}: {h['metric']}: {h['note']}" for h in headlines
             if h["note"] and (not h["met"] or (h.get("fitted") and h.get("hardware_only") is None))]
    return ("`hardware-only`: ours with every fitted knob at its hardware-only estimate (see [Calibration knobs](#knobs)); "
            "`-`: the headline depends on no fitted knob.\n\n" + table
            + ("\n\nNotes on missed headlines (and on those without a hardware-only value):\n\n" + "\n".join(notes) if notes else ""))


def _by_construction_md(headlines: list[dict[str, Any]]) -> str:
    built = [h for h in headlines if h.get("by_construction")]
    if not built:
        return "None in this report."
    notes = [f"- {h['experiment']}: {h['metric']}: {h['by_construction']}." for h in built]
    return headline_table([_prefixed(h) for h in built]) + "\n\nWhy:\n\n" + "\n".join(notes)
