"""`dualpath fidelity`: does the simulator predict the real system? (fidelity/run.py)"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..errors import InputError
from ..progress import reporter
from .io import console, out
from .runtime import DeviceOption, _device


def fidelity(
    workload: Annotated[str, typer.Option(help="demo | agents | tiny | mooncake (built-in), or a trajectory or Mooncake JSONL file")] = "demo",
    mode: Annotated[Optional[list[str]], typer.Option(help="modes to compare (repeatable)")] = None,
    repeat: Annotated[int, typer.Option(help="runtime runs per mode (their spread is reported)")] = 3,
    model: Annotated[str, typer.Option(help="smollm2-135m or tiny")] = "smollm2-135m",
    rounds: Annotated[Optional[int], typer.Option(help="rounds per agent (demo, tiny)")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the report JSON here")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="write a PNG figure here")] = None,
    device: DeviceOption = "cpu",
) -> None:
    """Run one workload on the local runtime cluster and in the simulator's `local` preset; print
    the simulator's error per metric against the runtime (and the runtime's own spread)."""
    from ..fidelity.run import run_fidelity
    from ..sim.runner import write_json

    modes = mode or ["basic", "dualpath"]
    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")
    _device(device)
    with reporter("fidelity", "turns", console) as progress:
        progress.log(f"{workload} workload: {repeat} runtime run(s) per mode, then the simulator")
        report = asyncio.run(run_fidelity(workload, modes, repeat, model, device, rounds, on_turn=progress.update))
    print_fidelity(report)
    if json_path:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if plot:
        from ..fidelity.plot import plot_fidelity

        plot_fidelity(report, plot)
        console.print(f"wrote {plot}")


def print_fidelity(report: dict) -> None:
    for mode, r in report["modes"].items():
        table = Table(title=f"fidelity, {report['workload']} workload, {mode}")
        for col in ("metric", "runtime mean", "runtime spread", "simulator", "error", "goal", "met",
                    "error, shared CNICs", "error, start speed"):
            table.add_column(col, justify="right")
        shared, start = r.get("sim_shared_cnics", {}), r.get("sim_start_speed", {})
        for name, m in r["metrics"].items():
            if name == "snic_utilisation":
                continue
            goal = m.get("goal")
            alt, at_start = shared.get(name), start.get(name)
            table.add_row(name, f"{m['runtime_mean']:.4g}", f"{100 * m['runtime_spread']:.1f}%", f"{m['sim']:.4g}",
                          f"{100 * m['rel_error']:+.1f}%", "-" if goal is None else f"{100 * goal:.0f}%",
                          "-" if goal is None else ("yes" if m["met"] else "NO"),
                          "-" if alt is None else f"{100 * alt['rel_error']:+.1f}%",
                          "-" if at_start is None else f"{100 * at_start['rel_error']:+.1f}%")
        d = r["decisions"]
        table.add_row("same read side", "", "", "", f"{100 * d['same_side_mean']:.0f}%", f"{100 * d['side_goal']:.0f}%",
                      "yes" if d["side_met"] else "NO", "", "")
        out.print(table)
        speed = r.get("in_run_speed")
        if speed:
            out.print(f"{mode}: model time during the runs over the profile's (checked at start): "
                      f"prefill {speed['prefill']:.3f}, decode {speed['decode']:.3f} (fidelity/speed.py)")
