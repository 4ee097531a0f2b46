"""`dualpath repro [--quick] [--only NAME]... --out DIR [--seed N] [--ray ADDRESS [--workers N]]`:
regenerate the paper's experiments in the simulator, serially or as Ray tasks (deploy/ray/pool.py).

Register in `dualpath.cli` with `app.command()(repro)`; `python -m dualpath.experiments.cli`
runs it standalone. Bad input raises `InputError` (the main CLI prints it and exits 2).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .._build import build_line
from ..errors import InputError, run_cli
from ..pool.executor import open_executor
from ..progress import PlainProgress
from .common import Context
from .registry import ALL, OPT_IN
from .simrun import code_fingerprint
from .suite import resolve_names, run_suite

console = Console(stderr=True, soft_wrap=True)  # status lines ("wrote PATH") never hard-wrap a path
app = typer.Typer(add_completion=False, help="Regenerate the paper's experiments in the simulator.")


class RichProgress:
    """Overall bar over experiments, one transient bar per simulation (agents finished)."""

    def __init__(self, progress: Progress, num_experiments: int) -> None:
        self.progress = progress
        self.overall = progress.add_task("experiments", total=num_experiments)
        self.num_sims = 0
        self.num_cached = 0

    def start_experiment(self, name: str) -> None:
        self.progress.update(self.overall, description=f"experiment [bold]{name}[/bold]")

    def end_experiment(self, name: str, wall_s: float) -> None:
        self.progress.advance(self.overall)
        self.progress.console.log(f"{name}: done in {wall_s:.0f} s")

    def start_sim(self, label: str, total: int) -> Any:
        self.num_sims += 1
        return self.progress.add_task(f"  sim {label} (agents done)", total=total)

    def update_sim(self, task: Any, done: int, total: int) -> None:
        self.progress.update(task, completed=done)

    def end_sim(self, task: Any) -> None:
        self.progress.remove_task(task)

    def cached(self, label: str) -> None:
        self.num_cached += 1

    def sim_finished(self, label: str, wall_s: float, num_done: int, num_total: int) -> None:
        self.num_sims += 1
        self.progress.console.log(f"sim {num_done}/{num_total} {label}: {wall_s:.1f} s")


class PlainLinesProgress:
    """Without a terminal: a line per experiment and `PlainProgress` lines per simulation."""

    def __init__(self, lines: PlainProgress, num_experiments: int) -> None:
        self.lines = lines
        self.num_experiments = num_experiments
        self.num_started = 0
        self.num_sims = 0
        self.num_cached = 0

    def start_experiment(self, name: str) -> None:
        self.num_started += 1
        self.lines.log(f"experiment {name} ({self.num_started}/{self.num_experiments})")

    def end_experiment(self, name: str, wall_s: float) -> None:
        self.lines.log(f"{name}: done in {wall_s:.0f} s")

    def start_sim(self, label: str, total: int) -> Any:
        self.num_sims += 1
        self.lines.update(label, 0, total)
        return label

    def update_sim(self, task: Any, done: int, total: int) -> None:
        self.lines.update(task, done, total)

    def end_sim(self, task: Any) -> None:
        self.lines.end_mode(task)

    def cached(self, label: str) -> None:
        self.num_cached += 1

    def sim_finished(self, label: str, wall_s: float, num_done: int, num_total: int) -> None:
        self.num_sims += 1
        self.lines.log(f"sim {num_done}/{num_total} {label}: {wall_s:.1f} s")


RAY_HELP = ("run the simulations as Ray tasks: `local` (a Ray cluster on this machine for this command), `auto` "
            "(the one `ray start` runs here) or HOST:PORT of a head; needs pip install 'dualpath[cluster]'")
WORKERS_HELP = ("simulations at once: with --ray local, the local cluster's CPUs (default: every core); without "
                "--ray, processes of this host (default: 1, in this process)")


def repro(
    out: Annotated[Path, typer.Option("--out", help="output directory: report.md, summary.json, <name>.json, PNGs")],
    quick: Annotated[bool, typer.Option("--quick", help="reduced scale: the whole suite in minutes")] = False,
    only: Annotated[Optional[list[str]], typer.Option("--only", help=f"run only this experiment (repeat): {', '.join(ALL)}; {', '.join(OPT_IN)} only when named")] = None,
    seed: Annotated[int, typer.Option(help="workload seed")] = 1,
    cache: Annotated[bool, typer.Option(help="reuse simulation results cached under DIR/cache (same spec, seed and simulator code)")] = True,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)] = None,
    workers: Annotated[Optional[int], typer.Option(help=WORKERS_HELP)] = None,
) -> None:
    """Regenerate every experiment of the paper (or --only some) and compare with its numbers."""
    names = resolve_names(only)
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out} exists and is not a directory")
    t0 = time.perf_counter()
    scale = "quick" if quick else "full"
    with open_executor(ray, workers, code_fingerprint, _say_build) as executor:
        outputs, sink = _run(Context(out, scale=scale, seed=seed, use_disk_cache=cache, executor=executor), names)
    table = Table(title=f"dualpath repro ({scale}) -> {out}")
    for col in ("experiment", "wall s", "simulations", "simulation wall s", "headlines met"):
        table.add_column(col, justify="right")
    for o in outputs:  # headlines met by construction are not counted (the report lists them apart)
        counted = [h for h in o.headlines if h.counted]
        table.add_row(o.name, f"{o.wall_s:.0f}", str(o.num_sims), f"{o.sim_wall_s:.0f}",
                      f"{sum(h.met for h in counted)} / {len(counted)}")
    Console().print(table)
    for o in outputs:  # an experiment without the paper's numbers says what it found in one line
        if "verdict" in o.extra:
            Console().print(f"{o.name}: {o.extra['verdict']}")
    console.print(f"{sink.num_sims} simulations run, {sink.num_cached} from cache; total {time.perf_counter() - t0:.0f} s; "
                  f"wrote {out / 'report.md'} and {out / 'summary.json'}")


def _say_build() -> None:
    console.print(build_line(), markup=False, highlight=False)


def _run(ctx: Context, names: list[str]) -> tuple[list[Any], RichProgress | PlainLinesProgress]:
    """The suite with a progress bar on a terminal, plain lines on stdout otherwise (a log or a pipe:
    at most one per 5 s, and one per finished simulation)."""
    sink: RichProgress | PlainLinesProgress
    if sys.stdout.isatty():
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=False) as progress:
            ctx.progress = sink = RichProgress(progress, len(names))
            return run_suite(ctx, names), sink
    with PlainProgress("repro", "agents", sys.stdout) as lines:
        ctx.progress = sink = PlainLinesProgress(lines, len(names))
        return run_suite(ctx, names), sink


app.command()(repro)


def main() -> None:
    run_cli(app)


if __name__ == "__main__":
    main()
