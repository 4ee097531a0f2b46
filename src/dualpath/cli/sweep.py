"""`dualpath sweep SPEC.yaml --out DIR [--ray ADDRESS [--workers N]]`: a grid of simulations
(sweep/spec.py) -> DIR/sweep.csv, DIR/sweep.json, DIR/sweep.png and the table printed.

Bad input (an unknown key or value in SPEC, a bad --ray address, Ray missing) is one error line
and exit 2 before anything runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from ..errors import InputError
from ..experiments.cli import RAY_HELP, WORKERS_HELP
from .io import console, out, say_build


class SweepLines:
    """A status line per finished simulation (on stderr), whichever executor ran it."""

    def __init__(self, num_total: int, prefix: str = "sweep") -> None:
        self.num_total, self.num_done, self.num_cached, self.prefix = num_total, 0, 0, prefix

    def start_experiment(self, name: str) -> None:
        pass

    def end_experiment(self, name: str, wall_s: float) -> None:
        pass

    def start_sim(self, label: str, total: int) -> Any:
        return label

    def update_sim(self, task: Any, done: int, total: int) -> None:
        pass

    def end_sim(self, task: Any) -> None:
        self.num_done += 1
        console.print(f"{self.prefix}: {self._count()} {task}", markup=False, highlight=False)

    def cached(self, label: str) -> None:
        self.num_cached += 1

    def sim_finished(self, label: str, wall_s: float, num_done: int, num_total: int) -> None:
        self.num_done += 1
        console.print(f"{self.prefix}: {self._count()} {label}: {wall_s:.1f} s", markup=False, highlight=False)

    def _count(self) -> str:
        """'3/16', or '3' when the total is not known up front (the planner's climb)."""
        done = self.num_done + self.num_cached
        return f"{done}/{self.num_total}" if self.num_total else str(done)


def sweep(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.yaml", help="the grid (examples/sweep.yaml)")],
    out_dir: Annotated[Path, typer.Option("--out", help="output directory: sweep.csv, sweep.json, sweep.png, cache/")],
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)] = None,
    workers: Annotated[Optional[int], typer.Option(help=WORKERS_HELP)] = None,
    cache: Annotated[bool, typer.Option(help="reuse results cached under DIR/cache (same spec, seed and simulator code)")] = True,
) -> None:
    """Simulate a grid (model x P/D x MaxLen x agents x tool time x mode x seed): one table and a plot."""
    from ..experiments.simrun import code_fingerprint
    from ..pool.executor import open_executor
    from ..sweep.report import plot, write_table
    from ..sweep.run import run_sweep
    from ..sweep.spec import load_spec

    spec = load_spec(spec_path)
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} exists and is not a directory")
    lines = SweepLines(len(spec.points()))
    with open_executor(ray, workers, code_fingerprint, say_build) as executor:
        rows = run_sweep(spec, out_dir, executor, lines, use_cache=cache)
    paths = [*write_table(rows, out_dir), plot(rows, out_dir / "sweep.png")]
    _print(rows)
    console.print(f"{lines.num_done} simulations run, {lines.num_cached} from cache; wrote "
                  + ", ".join(str(p) for p in paths), markup=False, highlight=False)


def _print(rows: list[dict[str, Any]]) -> None:
    table = Table(title="dualpath sweep")
    tools = any(r.get("tool_time_s") for r in rows)  # the tool-time column only where a grid has the axis
    heads = ("model", "P/D", "MaxLen", "agents", *(("tool s",) if tools else ()), "mode", "seed", "JCT s", "TTFT p50 s",
             "TPOT ms", "SNIC max/avg", "turns")
    for h in heads:
        table.add_column(h, justify="right")

    def f(x: Any, fmt: str) -> str:
        return "-" if x is None or x != x else fmt.format(x)

    for r in rows:
        tool = (f"{r.get('tool_time_s', 0.0):g}",) if tools else ()
        table.add_row(r["model"], r["pd"], f"{r['max_len_tokens'] // 1024}K", str(r["agents"]), *tool, r["mode"],
                      str(r["seed"]), f(r["jct_s"], "{:.1f}"), f(r["ttft_p50_s"], "{:.2f}"),
                      f(r["tpot_mean_s"] and r["tpot_mean_s"] * 1e3, "{:.1f}"), f(r["snic_max_over_avg"], "{:.2f}"),
                      str(r["num_turns"]))
    out.print(table)
