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
from typing import Any, Sequence

from ..errors import InputError
from ..sim.runner import write_json
from .batch import prefetch
from .common import Context, ExperimentOutput, Headline, headline_table
from .knobs import all_knob_rows, calibration_sentence, knobs_markdown
from .registry import EXPERIMENTS
from .simrun import code_fingerprint


def resolve_names(only: Sequence[str] | None) -> list[str]:
    """Registry order; `only` entries may be comma-separated; unknown names raise InputError."""
    if not only:
        return list(EXPERIMENTS)
    wanted = [w.strip() for item in only for w in item.split(",") if w.strip()]
    unknown = [w for w in wanted if w not in EXPERIMENTS]
    if unknown or not wanted:
        raise InputError(f"unknown experiment {', '.join(map(repr, unknown)) or '(empty)'}: choose from {', '.join(EXPERIMENTS)}")
    return [n for n in EXPERIMENTS if n in wanted]


def run_suite(ctx: Context, names: Sequence[str]) -> list[ExperimentOutput]:
    if ctx.out_dir.exists() and not ctx.out_dir.is_dir():
        raise InputError(f"--out {ctx.out_dir} exists and is not a directory")
    ctx.out_dir.mkdir(parents=True, exist_ok=True)
    # On a parallel executor, every run the experiments know up front goes out as one batch; the
    # experiments then read them from the memo (adaptive steps follow as batches of their own).
    prefetch(ctx, [spec for name in names for spec in getattr(EXPERIMENTS[name], "planned", lambda _: [])(ctx)])
    outputs = []
    for name in names:
        module = EXPERIMENTS[name]
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
        write_json({**out.to_json(), "markdown": out.markdown, "scale": ctx.scale, "seed": ctx.seed}, ctx.out_dir / f"{name}.json")
        outputs.append(out)
        write_report(ctx)
    return outputs


def _load_sections(ctx: Context) -> list[dict[str, Any]]:
    sections = []
    for name in EXPERIMENTS:
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
    summary = {
        "scale": ctx.scale,
        "seed": ctx.seed,
        "simulator_code": code_fingerprint(),
        "experiments": {s["name"]: {"wall_s": s["wall_s"], "sim_wall_s": s.get("sim_wall_s"), "num_sims": s.get("num_sims"),
                                    "sim_builds": s.get("sim_builds", []), **_counts(s["headlines"])} for s in sections},
        "wall_s_total": sum(s["wall_s"] for s in sections),
        "counts": _counts(headlines),
        "headlines": headlines,
        "knobs": [k.to_dict() for k in all_knob_rows()],
    }
    write_json(summary, ctx.out_dir / "summary.json")
    (ctx.out_dir / "report.md").write_text(_report_markdown(ctx, sections, headlines))


def _counts(headlines: list[dict[str, Any]]) -> dict[str, int]:
    """Headlines counted as agreement with the paper (not met by construction), met, met by
    construction, and, of those with a hardware-only value, how many it meets."""
    counted = [h for h in headlines if not h.get("by_construction")]
    with_hw = [h for h in counted if h.get("hardware_only_met") is not None]
    return {"headlines": len(counted), "met": sum(1 for h in counted if h["met"]),
            "by_construction": len(headlines) - len(counted),
            "hardware_only_simulated": len(with_hw), "hardware_only_met": sum(1 for h in with_hw if h["hardware_only_met"]),
            "fitted_without_hardware_only": sum(1 for h in counted if h.get("fitted") and h.get("hardware_only") is None)}


def _report_markdown(ctx: Context, sections: list[dict[str, Any]], headlines: list[dict[str, Any]]) -> str:
    c = _counts(headlines)
    lines = [
        "# DualPath: the paper's experiments in the simulator",
        "",
        f"Generated by `dualpath repro{' --quick' if ctx.scale == 'quick' else ''}` (scale `{ctx.scale}`, seed {ctx.seed}). "
        "Every number of the paper carries its PAPER.md provenance tag ([P] text, [F] pixel reading, [I] inference); "
        "rel. error = ours / paper - 1. Simulator knobs are the presets of `dualpath.config`, listed with their kind and "
        "source under [Calibration knobs](#knobs). " + calibration_sentence(),
        "",
        f"**{c['met']} of {c['headlines']} headlines met**, not counting {c['by_construction']} met by construction "
        "([listed apart](#by-construction)). With every fitted knob at its hardware-only estimate: "
        f"{c['hardware_only_met']} of the {c['hardware_only_simulated']} headlines simulated that way met"
        + (f" ({c['fitted_without_hardware_only']} without a hardware-only value, see their notes)." if c["fitted_without_hardware_only"] else "."),
        "",
        "Wall times: `this run` is this invocation's (small when its simulations came from DIR/cache); "
        "`simulations` sums the wall time of the experiment's simulations when they were first run (a run "
        "shared by several experiments counts in each). Both on the machine that ran them. `build` is the "
        "simulator build that ran the simulations (`pure` Python or `compiled` with mypyc, `make compiled`): "
        "it changes wall times only, never a simulated number.",
        "",
        "| experiment | wall s (this run) | simulations | simulation wall s | build | headlines met |",
        "|---|---|---|---|---|---|",
    ]
    for s in sections:
        sc = _counts(s["headlines"])
        n_met, n_counted, n_built = sc["met"], sc["headlines"], sc["by_construction"]
        lines.append(f"| [{s['name']}](#{s['name']}) | {s['wall_s']:.0f} | {s.get('num_sims', 0)} | "
                     f"{s.get('sim_wall_s', 0.0):.0f} | {', '.join(s.get('sim_builds', [])) or '-'} | "
                     f"{n_met} / {n_counted}{f' (+{n_built} by construction)' if n_built else ''} |")
    lines += ["", "## All headlines", "", _headlines_md([h for h in headlines if not h.get("by_construction")]), "",
              "<a id=\"by-construction\"></a>", "## Met by construction (not counted)", "",
              "These agree with the paper because of how the simulator or the experiment is built, not because the "
              "simulator reproduces the testbed; they are not counted above.", "", _by_construction_md(headlines), ""]
    for s in sections:
        lines += [f"<a id=\"{s['name']}\"></a>", f"## {s['title']}", "",
                  f"Wall time: {s['wall_s']:.0f} s this run; {s.get('num_sims', 0)} simulations, "
                  f"{s.get('sim_wall_s', 0.0):.0f} s when first simulated.", "", s["markdown"], ""]
    lines += ["<a id=\"knobs\"></a>", "## Calibration knobs", "", knobs_markdown(), ""]
    return "\n".join(lines)


def _prefixed(h: dict[str, Any]) -> Headline:
    return Headline.from_dict({**h, "metric": f"{h['experiment']}: {h['metric']}"})


def _headlines_md(headlines: list[dict[str, Any]]) -> str:
    table = headline_table([_prefixed(h) for h in headlines])
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
