"""`dualpath fidelity`: does the simulator predict the real system? (fidelity/run.py)"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..errors import InputError
from ..fidelity.compare import describe_speed
from ..progress import reporter
from .io import console, out
from .runtime import DeviceOption, _device


def fidelity(
    workload: Annotated[str, typer.Option(help="the scored workload: demo | agents | tiny | mooncake, with settings as "
                                               "NAME:key=value,... (e.g. agents:max_len=16k,seed=7), or a "
                                               "trajectory or Mooncake JSONL file")] = "demo",
    calibrate_on: Annotated[Optional[list[str]], typer.Option(
        help="workloads whose runs measure the cluster's compute contention for the prediction (repeatable; "
             "never the scored one; `none`: the speed checked before each run only). Default: demo, or "
             "mooncake when the demo is scored")] = None,
    mode: Annotated[Optional[list[str]], typer.Option(help="modes to compare (repeatable)")] = None,
    repeat: Annotated[int, typer.Option(help="scored runtime runs per mode (their spread is reported)")] = 3,
    model: Annotated[str, typer.Option(help="smollm2-135m or tiny")] = "smollm2-135m",
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the report JSON here")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="write a PNG figure here")] = None,
    timeline: Annotated[Optional[Path], typer.Option(
        help="write per mode (FILE with the mode before its suffix) the predicted simulation and the first "
             "scored runtime run as Chrome trace events, side by side (open in Perfetto)")] = None,
    device: DeviceOption = "cpu",
) -> None:
    """Predict one workload with the simulator's `local` preset, calibrated on other workloads, and
    score the prediction against the local runtime cluster's runs: per metric the error, the
    runtime's own spread and the goal's verdict (fidelity/compare.py)."""
    from ..fidelity.run import run_fidelity
    from ..sim.runner import write_json

    modes = mode or ["basic", "dualpath"]
    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")
    _device(device)
    with reporter("fidelity", "turns", console) as progress:
        progress.log(f"{workload}: calibration runs, then {repeat} scored runtime run(s) per mode, then the simulator")
        report = asyncio.run(run_fidelity(workload, modes, repeat, model, device, calibrate_on, on_turn=progress.update,
                                          timeline=timeline is not None))
    print_fidelity(report)
    if timeline:
        from ..metrics.timeline import timeline_path, write_trace

        for mode, r in report["modes"].items():
            console.print(f"wrote {write_trace(r.pop('timeline'), timeline_path(timeline, mode))}")
    if json_path:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if plot:
        from ..fidelity.plot import plot_fidelity

        plot_fidelity(report, plot)
        console.print(f"wrote {plot}")


_ERROR_COLUMNS = ("replayed", "start_speed", "shared_cnics")


def _noise(n: float | None) -> str:
    """An error's 90% confidence half-width (fidelity/compare.py: `paired`; one run: unknown)."""
    return "-" if n is None or not n < float("inf") else f"{100 * n:.1f}%"


def print_fidelity(report: dict) -> None:
    cal = report["calibration"]
    def drift(d: dict) -> str:
        return f"prefill {d['prefill']:.3f}, decode {d['decode']:.3f}"

    out.print(f"calibrated on {', '.join(cal['workloads']) or 'nothing (drift only)'}; drift before / after the scored "
              f"runs: {'; '.join(f'{drift(a)} / {drift(b)}' for a, b in zip(report['drift'], report['drift_after']))}")
    for mode, r in report["modes"].items():
        table = Table(title=f"fidelity, {report['workload']}, {mode}: predicted vs {report['repeat']} runtime run(s)")
        for col in ("metric", "runtime mean", "spread", "predicted", "error", "± noise", "goal", "verdict",
                    *(f"error, {c.replace('_', ' ')}" for c in _ERROR_COLUMNS)):
            table.add_column(col, justify="right")
        pred = r["errors"]["predicted"]
        for name, stats in r["runtime"].items():
            if name == "snic_utilisation":
                continue
            e = pred[name]
            goal = e.get("goal")
            table.add_row(name, f"{stats['mean']:.4g}", f"{100 * stats['spread']:.1f}%", f"{e['sim']:.4g}",
                          f"{100 * e['rel_error']:+.1f}%", _noise(e.get("noise")), "-" if goal is None else f"{100 * goal:.0f}%",
                          e.get("verdict", "-"),
                          *(f"{100 * r['errors'][c][name]['rel_error']:+.1f}%" for c in _ERROR_COLUMNS))
        d = r["decisions"]
        table.add_row("same read side", "", "", "", f"{100 * d['same_side_mean']:.0f}%", "", "", "", "", "", "")
        near = [x for x in (a.get("near_tie") for a in d["vs_sim"]) if isinstance(x, float) and not math.isnan(x)]
        if near:  # of the turns read on different sides, those decided within a block of a tie
            table.add_row("  of the rest, near-ties", "", "", "", f"{100 * min(near):.0f}-{100 * max(near):.0f}%",
                          "", "", "", "", "", "")
        out.print(table)
        s = r["speed"]
        out.print(f"{mode}: speed on the profile (fidelity/speed.py): predicted {describe_speed(s['predicted'])}; "
                  f"the scored runs' own {describe_speed(s['replayed'])}")
        for name, why in r["causes"].items():
            out.print(f"{mode}: {name} missed: {why}")
