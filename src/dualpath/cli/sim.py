"""`dualpath sim | trace gen | trace stats`: the simulator and the workloads.

Bad input (unknown names, malformed values or file lines) raises InputError: one clear message,
exit code 2 (errors.run_cli), never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..config import ClusterConfig, SimConfig, WorkloadConfig, paper_cluster, parse_mode
from ..parsing import parse_tokens
from ..config.overrides import apply_overrides
from ..errors import InputError
from ..experiments.cli import RAY_HELP, WORKERS_HELP
from ..progress import reporter
from .io import console, out, say_build
from .results import SIM_COLUMNS, print_runs


def _positive(value: int, option: str) -> int:
    if value <= 0:
        raise InputError(f"{option} must be positive, got {value}")
    return value


def build_sim_config(model: str, pd: Optional[str], max_len: str, agents: int, seed: int, aps: Optional[float],
                     trajectories: Optional[Path], append_scale: float = 1.0, gen_scale: float = 1.0,
                     tool_time_s: float = 0.0, tool_sigma: float = 1.0) -> SimConfig:
    cluster: ClusterConfig = paper_cluster(model, pd)
    workload = WorkloadConfig(
        max_len_tokens=parse_tokens(max_len), num_agents=_positive(agents, "--agents"), seed=seed,
        arrival_aps=aps, append_scale=append_scale, gen_scale=gen_scale,
        tool_time_median_s=tool_time_s, tool_time_sigma=tool_sigma,
        trajectory_file=str(trajectories) if trajectories else None,
    )
    if trajectories is not None:
        if not trajectories.is_file():
            raise InputError(f"workload file not found: {trajectories}")
        from ..workloads import detect_format

        detect_format(trajectories)  # neither format: a one-line error before anything runs
    return SimConfig(cluster=cluster, workload=workload)


TOOL_TIME_HELP = ("median tool time in seconds between an agent's rounds, log-normal (workloads/tool_time.py); "
                  "0 = back to back, the paper's replay (default)")
TOOL_SIGMA_HELP = "spread of the tool time: sigma of its log (1 = a tenth under 0.28x the median, a tenth over 3.6x)"


def sim(
    model: Annotated[str, typer.Option(help="ds-v3.2-660b, ds-27b, qwen2.5-32b, ...")] = "ds-v3.2-660b",
    pd: Annotated[Optional[str], typer.Option(help="P/D shape, e.g. 2P4D (default: the paper's for the model)")] = None,
    max_len: Annotated[str, typer.Option(help="trajectory MaxLen, e.g. 64k")] = "64k",
    agents: Annotated[int, typer.Option(help="number of agents (generated, or the first of a trajectory file)")] = 1024,
    mode: Annotated[Optional[list[str]], typer.Option(help="basic | dualpath | oracle | dualpath+split | selective (beyond the paper) | basic+layerwise[+de_read][+scheduler]; any +tail, +selective, +dram; repeat")] = None,
    seed: Annotated[int, typer.Option(help="workload seed")] = 1,
    aps: Annotated[Optional[float], typer.Option(help="online: Poisson agent arrivals per second (default: offline)")] = None,
    trajectories: Annotated[Optional[Path], typer.Option(
        "--trajectories", "--trace",
        help="trajectory JSONL, an agentic Mooncake trace (session_id) or a Mooncake trace (auto-detected) instead of the generator")] = None,
    limit: Annotated[Optional[int], typer.Option(help="Mooncake: the first N requests that fit --max-len (default: every one)")] = None,
    time_scale: Annotated[float, typer.Option(help="Mooncake: multiply timestamps (as `dualpath run`)")] = 1.0,
    append_scale: Annotated[float, typer.Option(help="multiply every round's append (Fig. 9)")] = 1.0,
    gen_scale: Annotated[float, typer.Option(help="multiply every round's generation (Fig. 9)")] = 1.0,
    tool_time: Annotated[float, typer.Option(help=TOOL_TIME_HELP)] = 0.0,
    tool_sigma: Annotated[float, typer.Option(help=TOOL_SIGMA_HELP)] = 1.0,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the result JSON here")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="write a PNG figure here")] = None,
    quiet: Annotated[bool, typer.Option(help="no progress (a bar on a terminal, a line every 5 s otherwise)")] = False,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="override a config field: section.field=value (e.g. compute.prefill_mfu=0.3); repeat")] = None,
    turns: Annotated[Optional[Path], typer.Option(help="write every finished turn of every mode to this CSV (timings, engines)")] = None,
    decisions: Annotated[Optional[Path], typer.Option(help="write every scheduling decision as JSONL, one file per mode: F -> F.<mode>.jsonl")] = None,
    timeline: Annotated[Optional[Path], typer.Option(help="write each mode's spans as a Chrome trace (Perfetto), one file per mode: F.json -> F.<mode>.json")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="ADDRESS", help="each mode a Ray task: " + RAY_HELP.split(": ", 1)[1])] = None,
    workers: Annotated[Optional[int], typer.Option(help=WORKERS_HELP)] = None,
) -> None:
    """Simulate a PD-disaggregated cluster on an agentic workload, one run per mode.

    A Mooncake trace is replayed open loop, as `dualpath run` replays it (sim/runner.py)."""
    from ..sim.runner import TraceReplay, plot_runs, run_modes, write_json

    replay = TraceReplay(time_scale, limit)
    modes = mode or ["basic", "dualpath", "oracle"]
    list(map(parse_mode, modes))  # an unknown mode: one line before anything runs
    cfg = apply_overrides(build_sim_config(model, pd, max_len, agents, seed, aps, trajectories, append_scale, gen_scale,
                                           tool_time, tool_sigma), set_ or [])
    if turns is not None:
        turns.parent.mkdir(parents=True, exist_ok=True)
    if ray is not None or workers is not None:
        result = _sim_apart(cfg, modes, replay, ray, workers, not quiet, turns, decisions, timeline)
    else:
        files = dict(turns_csv=turns, replay=replay, decisions=decisions, timeline=timeline, on_loaded=say_build)
        if quiet:
            result = run_modes(cfg, modes, **files)
        else:
            with reporter("sim", "agents", console) as progress:
                result = run_modes(cfg, modes, progress.update, **files)
    print_runs(result, "simulated runs", 1e12, "TB", SIM_COLUMNS)
    written = [] if turns is None else [turns]
    written += [r[key] for r in result["runs"] for key in ("decisions_file", "timeline_file") if key in r]
    for path in written:
        console.print(f"wrote {path}")
    if json_path:
        write_json(result, json_path)
        console.print(f"wrote {json_path}")
    if plot:
        plot_runs(result, plot, f"{cfg.cluster.model} {cfg.cluster.pd} {max_len} {result['runs'][0]['num_agents']} agents")
        console.print(f"wrote {plot}")


def _sim_apart(cfg: SimConfig, modes: list[str], replay, address: Optional[str], workers: Optional[int],
               with_progress: bool, turns: Optional[Path], decisions: Optional[Path], timeline: Optional[Path] = None) -> dict:
    """`run_modes`'s result with each mode a Ray task or, with --workers alone, a process of this
    host (sim/runner.run_mode): the same numbers, a line per finished mode."""
    from ..experiments.simrun import code_fingerprint
    from ..pool.executor import open_executor
    from ..sim.runner import load_workload, run_mode

    if turns is not None or decisions is not None or timeline is not None:
        raise InputError("--turns, --decisions and --timeline need the simulations in this process: drop --ray and --workers")
    stats = load_workload(cfg, replay).stats  # also checks the workload before Ray starts
    runs: dict[int, dict] = {}

    def landed(i: int, r: dict) -> None:
        runs[i] = r
        console.print(f"sim {modes[i]}: done ({len(runs)}/{len(modes)}), {r['wall_s']:.1f} s")

    with open_executor(address, workers, code_fingerprint, say_build) as executor:
        executor.map(run_mode, [(cfg, m, replay, with_progress) for m in modes], landed)
    return {"config": cfg.to_dict(), "workload": stats, "runs": [runs[i] for i in range(len(modes))]}


def trace_gen(
    max_len: Annotated[str, typer.Option(help="MaxLen, e.g. 64k")] = "64k",
    agents: Annotated[int, typer.Option(help="number of trajectories")] = 500,
    seed: Annotated[int, typer.Option(help="seed")] = 7,
    output: Annotated[Path, typer.Option("-o", "--output", help="JSONL file to write")] = Path("trajectories.jsonl"),
    tool_time: Annotated[float, typer.Option(help=TOOL_TIME_HELP)] = 0.0,
    tool_sigma: Annotated[float, typer.Option(help=TOOL_SIGMA_HELP)] = 1.0,
) -> None:
    """Generate Table-2-calibrated agent trajectories as JSONL (with --tool-time, a wait before each
    round after the first: its third number)."""
    from ..workloads import generate, write_trajectories
    from ..workloads.tool_time import with_tool_times

    trajs = with_tool_times(generate(parse_tokens(max_len), _positive(agents, "--agents"), seed), tool_time, tool_sigma, seed)
    write_trajectories(output, trajs)
    console.print(f"wrote {len(trajs)} trajectories to {output}")


def trace_stats(
    path: Annotated[Path, typer.Argument(help="trajectory JSONL, an agentic Mooncake trace or a Mooncake trace")],
    block_tokens: Annotated[int, typer.Option(help="block size for prefix_hit_ratio")] = 64,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """Table-2-style statistics of a workload file."""
    from ..workloads import load_any, workload_stats

    if not path.is_file():
        raise InputError(f"file not found: {path}")
    stats = workload_stats(load_any(path), _positive(block_tokens, "--block-tokens"))
    if as_json:
        out.print_json(json.dumps(stats))
        return
    table = Table(title=str(path))
    table.add_column("statistic")
    table.add_column("value", justify="right")
    for k, v in stats.items():
        table.add_row(k, f"{v:,.4g}" if isinstance(v, float) else str(v))
    out.print(table)


def _split_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated integers, got {text!r}") from None
