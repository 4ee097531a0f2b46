"""`dualpath plan`: which P/D shape and which loading policy for a model, a GPU budget and an
agent workload (plan/search.py). Prints the ranked table; `--json` and `--plot` write it."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer
from rich.table import Table

from ..errors import InputError
from ..experiments.cli import RAY_HELP
from .io import console, out, say_build
from .sim import TOOL_TIME_HELP
from .sweep import SweepLines

if TYPE_CHECKING:
    from ..plan.search import PlanRequest


PLAN_WORKERS_HELP = ("simulations at once: with --ray local, the local cluster's CPUs; without --ray, processes of "
                     "this host (default: every core)")
LOCAL_HELP = ("plan this machine's local runtime cluster for MODEL (smollm2-135m or tiny) instead: every shape of at "
              "most --engines engines, the demo's workload and rates, simulated with the `local` preset (plan/local.py)")


def plan(
    model: Annotated[str, typer.Option(help="a model preset: ds-v3.2-660b, ds-27b, qwen2.5-32b, ...")] = "ds-v3.2-660b",
    gpus: Annotated[int, typer.Option(help="the GPU budget, a multiple of the GPUs per node (8)")] = 128,
    max_len: Annotated[str, typer.Option(help="trajectory MaxLen of the generated agents, e.g. 64k")] = "64k",
    agents: Annotated[int, typer.Option(help="agents (offline: all at t = 0; with --aps: Poisson arrivals)")] = 1024,
    aps: Annotated[Optional[float], typer.Option(help="online: agent arrivals per second (default: offline)")] = None,
    tool_time: Annotated[float, typer.Option(help=TOOL_TIME_HELP)] = 0.0,
    trace: Annotated[Optional[Path], typer.Option(help="plan for a Mooncake trace replayed at its timestamps instead "
                                                       "of generated agents")] = None,
    time_scale: Annotated[float, typer.Option(help="with --trace: multiply its timestamps")] = 1.0,
    limit: Annotated[Optional[int], typer.Option(help="with --trace: its first N requests that fit --max-len")] = None,
    mode: Annotated[Optional[list[str]], typer.Option(
        help="loading policies to consider (repeatable; default basic, dualpath, dualpath+split, dualpath+tail)")] = None,
    objective: Annotated[str, typer.Option(help="jct: the shortest offline JCT; goodput: the most turns per "
                                                "second among those meeting the SLOs")] = "jct",
    slo_ttft_p99: Annotated[Optional[float], typer.Option(help="TTFT p99 SLO, seconds")] = None,
    slo_tpot: Annotated[Optional[float], typer.Option(help="mean TPOT SLO, seconds")] = None,
    confirm: Annotated[int, typer.Option(help="configurations simulated (the best estimates)")] = 4,
    bound: Annotated[bool, typer.Option(help="stop a later simulation once it cannot come first (listed as "
                                             "outranked); --no-bound: every simulation to its end")] = True,
    seed: Annotated[int, typer.Option(help="workload seed")] = 1,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the plan JSON here")] = None,
    plot_path: Annotated[Optional[Path], typer.Option("--plot", help="write the frontier PNG here")] = None,
    cache: Annotated[Optional[Path], typer.Option(help="reuse and keep simulations under DIR/cache")] = None,
    ray: Annotated[Optional[str], typer.Option("--ray", metavar="ADDRESS", help=RAY_HELP)] = None,
    workers: Annotated[Optional[int], typer.Option(help=PLAN_WORKERS_HELP)] = None,
    local: Annotated[Optional[str], typer.Option("--local", metavar="MODEL", help=LOCAL_HELP)] = None,
    engines: Annotated[int, typer.Option(help="with --local: the engine budget (one engine per emulated node)")] = 3,
) -> None:
    """Rank P/D shapes and loading policies for a GPU budget: the cost model prunes, the simulator
    (at the smallest unit of each shape) confirms the best estimates."""
    from ..bench.sim_speed import heap_ops_per_s
    from ..parsing import parse_tokens
    from ..plan.report import plot as draw, to_json
    from ..plan.search import PlanRequest
    from ..plan.space import DEFAULT_MODES
    from ..sim.runner import write_json

    modes = _modes(mode, DEFAULT_MODES if local is None else LOCAL_MODES)
    if local is not None:
        return _plan_local(local, engines, modes, json_path, plot_path)
    if agents <= 0:
        raise InputError(f"--agents must be positive, got {agents}")
    workload = _workload(parse_tokens(max_len), agents, seed, aps, trace, time_scale, limit, tool_time)
    req = PlanRequest(model, gpus, workload, modes, objective, slo_ttft_p99, slo_tpot, confirm, bound)
    # with --json, the machine's speed before and after (bench/sim_speed.py's fixed task, not in wall_s):
    # a plan's time means little without it on a machine whose speed drifts
    speed = [heap_ops_per_s()] if json_path else []
    result, wall_s = _make_plan(req, seed, cache, ray, workers)
    report = to_json(result, wall_s)
    if speed:
        report["machine_heap_ops_per_s"] = {"before": speed[0], "after": heap_ops_per_s()}
    _print(report)
    if json_path:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if plot_path:
        console.print(f"wrote {draw(result, plot_path)}")


def _make_plan(req: PlanRequest, seed: int, cache: Optional[Path], ray: Optional[str],
               workers: Optional[int]) -> tuple[Any, float]:
    """The plan and its wall time, its simulations on Ray, in `workers` processes, or one per core."""
    from ..experiments.common import Context
    from ..experiments.simrun import code_fingerprint
    from ..plan.search import make_plan
    from ..pool.executor import open_executor

    started = time.monotonic()
    if ray is None and workers is None:
        workers = len(os.sched_getaffinity(0))
    with open_executor(ray, workers, code_fingerprint, say_build) as executor:
        ctx = Context(cache or Path("."), seed=seed, progress=SweepLines(0, "plan"), use_disk_cache=cache is not None,
                      executor=executor)
        result = make_plan(req, ctx)
    return result, time.monotonic() - started


LOCAL_MODES = ("basic", "dualpath")  # the local preset refuses dualpath+split (docs/guide/simulator.md)


def _modes(given: Optional[list[str]], default: tuple[str, ...]) -> tuple[str, ...]:
    from ..config import parse_mode

    modes = tuple(given or default)
    for m in modes:
        parse_mode(m)
    if "oracle" in modes:
        raise InputError("--mode oracle is a bound, not a policy a cluster can run: plan among the others")
    return modes


def _plan_local(model: str, engines: int, modes: tuple[str, ...], json_path: Optional[Path],
                plot_path: Optional[Path]) -> None:
    from ..plan.local import LocalWorkload, available_cpus, local_shapes, plan_local
    from ..sim.runner import write_json

    if plot_path is not None:
        raise InputError("--plot draws the GPU planner's frontier; with --local write --json (bench plan-local plots "
                         "the local ranking beside the runtime's)")
    if model not in ("smollm2-135m", "tiny"):
        raise InputError(f"--local {model!r}: the local preset knows smollm2-135m and tiny")
    local_shapes(engines)  # checks the budget before anything is timed
    started = time.monotonic()
    work = LocalWorkload.of_demo(model)
    cpus = available_cpus()
    ranked = plan_local(work, engines, modes, cpus)
    report = {"model": model, "engines": engines, "cpus": cpus, "rates": work.rates.to_json(), "ranked": ranked,
              "wall_s": time.monotonic() - started}
    table = Table(title=f"dualpath plan --local: {model} on {cpus} CPUs, at most {engines} engines, "
                        f"SNIC {work.rates.snic_bytes_per_s / 1e6:.1f} MB/s per node (the demo's rates)")
    for h in ("#", "P/D", "mode", "JCT s", "TTFT p50 s", "TTFT p99 s", "TPOT ms", "CPU slowdown", "binding"):
        table.add_column(h, justify="right")
    for i, c in enumerate(ranked, 1):
        p = c["predicted"]
        table.add_row(str(i), c["pd"], c["mode"], f"{p['jct_s']:.1f}", f"{p['ttft_p50_s']:.2f}", f"{p['ttft_p99_s']:.2f}",
                      f"{p['tpot_s'] * 1e3:.1f}", f"{c['cpu_slowdown']:.2f}x", c["binding"])
    out.print(table)
    console.print(f"first choice: {ranked[0]['pd']} {ranked[0]['mode']}\n  {ranked[0]['command']}\n"
                  f"{len(ranked)} simulated; {report['wall_s']:.1f} s", markup=False, highlight=False)
    if json_path:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")


def _workload(max_len_tokens: int, agents: int, seed: int, aps: float | None, trace: Path | None, time_scale: float,
              limit: int | None, tool_time_s: float = 0.0):
    from ..plan.workload import Generated, Trace
    from ..sim.runner import TraceReplay

    if aps is not None and not aps > 0:
        raise InputError(f"--aps must be positive, got {aps}")
    if trace is None:
        if time_scale != 1.0 or limit is not None:
            raise InputError("--time-scale and --limit are for --trace")
        from ..workloads.tool_time import check_tool_time

        check_tool_time(tool_time_s, 1.0)
        return Generated(max_len_tokens, agents, seed, aps, tool_time_s)
    if aps is not None or tool_time_s:
        raise InputError("--aps and --tool-time are for generated agents: a trace's requests arrive at their timestamps")
    if not trace.is_file():
        raise InputError(f"--trace {trace}: no such file")
    from ..workloads import WorkloadFormat, detect_format

    if detect_format(trace) is not WorkloadFormat.MOONCAKE:
        raise InputError(f"--trace {trace}: not a Mooncake trace (timestamp, input_length, output_length, hash_ids)")
    TraceReplay(time_scale, limit)  # checks both
    return Trace(str(trace), max_len_tokens, time_scale, limit)


def _estimate_cell(e: dict) -> str:
    """Offline: the estimated JCT; online: the load at which the binding resource saturates."""
    sat = e["saturating_load"]
    return f"JCT {e['jct_s']:.0f} s" if sat is None else f"saturates x{sat:.3g}"


def _print(report: dict) -> None:
    req = report["request"]
    slo = [f"TTFT p99 <= {req['slo_ttft_p99_s']:g} s" if req["slo_ttft_p99_s"] else "",
           f"TPOT <= {req['slo_tpot_s'] * 1e3:g} ms" if req["slo_tpot_s"] else ""]
    table = Table(title=f"dualpath plan: {req['model']}, {req['gpus']} GPUs, {report['demand']['agents']} agents "
                        f"({', '.join(s for s in slo if s) or 'no SLO'}); objective {req['objective']}")
    for h in ("#", "P/D", "mode", "simulated as", "load", "JCT s", "TTFT p50 s", "TTFT p99 s", "TPOT ms", "goodput turns/s",
              "SLO", "binding", "estimate"):
        table.add_column(h, justify="right")
    for i, c in enumerate(report["ranked"], 1):
        p = c["predicted"]
        table.add_row(str(i), c["pd"], c["mode"], f"{c['unit_pd']} x{c['copies']}", f"x{c['load_factor']:.3g}",
                      f"{p['jct_s']:.0f}",
                      f"{p['ttft_p50_s']:.2f}", f"{p['ttft_p99_s']:.2f}", f"{p['tpot_s'] * 1e3:.1f}",
                      f"{p['goodput_rps']:.1f}", "met" if c["meets_slo"] else "missed", c["binding"],
                      _estimate_cell(c["estimate"]))
    out.print(table)
    for o in report.get("outranked", []):  # stopped at their bound (plan/search.py step 5)
        why = " and TTFT p99 certain to miss" if o["misses_ttft_slo"] else ""
        console.print(f"outranked: {o['pd']} {o['mode']}: JCT > {o['jct_above_s']:.0f} s{why} "
                      f"(stopped past the best JCT then, {o['bound_jct_s']:.0f} s)", markup=False, highlight=False)
    if report["ranked"]:
        best = report["ranked"][0]
        if not report["any_meets_slo"] and (req["slo_ttft_p99_s"] or req["slo_tpot_s"]):
            console.print("no simulated configuration meets the SLOs; ranked by the objective alone", markup=False)
        console.print(f"first choice: {best['pd']} {best['mode']}\n  {best['commands']['sim']}\n  "
                      f"{best['commands']['serve']}", markup=False, highlight=False)
    stopped = len(report.get("outranked", []))
    console.print(f"{len(report['ranked']) + stopped} simulated ({stopped} stopped at their bound), "
                  f"{len(report['unconfirmed'])} estimated only, "
                  f"{len(report['pruned'])} outside the bottleneck-free range; {report['wall_s']:.1f} s",
                  markup=False, highlight=False)


def bench_plan(
    case: Annotated[Optional[list[str]], typer.Option(help="a case to check (repeatable; default: every one)")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="cache of the full-scale simulations: DIR/cache")] = Path("out/plan"),
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the report JSON here")] = None,
    plot_path: Annotated[Optional[Path], typer.Option("--plot", help="write the figure here")] = None,
) -> None:
    """Is the planner's first choice right? Per case: the planner (timed), every configuration
    simulated whole, the regret and the unit-scale predictions' errors (bench/plan_check.py)."""
    from ..bench.plan_check import cases, check, plot as draw
    from ..experiments.simrun import code_fingerprint
    from ..sim.runner import write_json

    from ..pool.executor import open_executor

    known = cases()
    names = case or list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"unknown --case {', '.join(unknown)}; known: {', '.join(known)}")
    lines = SweepLines(0, "bench plan")
    workers = len(os.sched_getaffinity(0))  # the planner as `dualpath plan` runs it: every core
    with open_executor(None, workers) as executor:
        report = {"cases": [check(known[n], out_dir, lines, executor) for n in names], "simulator_code": code_fingerprint(),
                  "workers": workers}
    table = Table(title="dualpath plan against every configuration simulated whole")
    for h in ("case", "first choice", "exhaustive best", "regret", "JCT err", "TTFT p50 err", "TTFT p99 err",
              "unit max |JCT err|", "plan s"):
        table.add_column(h, justify="right")
    for c in report["cases"]:
        e = c["prediction_error"]
        units = [abs(u["jct_s_error"]) for u in c["unit_vs_whole"] if u["jct_s_error"] is not None]
        pct = lambda x: "-" if x is None else f"{x * 100:+.1f}%"  # noqa: E731
        table.add_row(c["name"], f"{c['planner']['first']['pd']} {c['planner']['first']['mode']}",
                      f"{c['best']['pd']} {c['best']['mode']}", f"{c['regret'] * 100:.1f}%", pct(e["jct_s"]),
                      pct(e["ttft_p50_s"]), pct(e["ttft_p99_s"]), f"{max(units) * 100:.1f}%" if units else "-",
                      f"{c['planner']['wall_s']:.1f}")
    out.print(table)
    if json_path:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if plot_path:
        console.print(f"wrote {draw(report, plot_path)}")


def bench_plan_local(
    model: Annotated[str, typer.Option(help="smollm2-135m or tiny")] = "smollm2-135m",
    engines: Annotated[int, typer.Option(help="the engine budget (every shape of at most this many engines)")] = 3,
    mode: Annotated[Optional[list[str]], typer.Option(help="modes (repeatable; default basic, dualpath)")] = None,
    repeat: Annotated[int, typer.Option(help="runtime runs per configuration (their range is reported)")] = 2,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the report JSON here")] = None,
    plot_path: Annotated[Optional[Path], typer.Option("--plot", help="write the figure here")] = None,
) -> None:
    """Does `plan --local` rank the local cluster's shapes as the runtime's measured JCT does? The
    planner, then every configuration run `--repeat` times on the runtime (bench/plan_local.py)."""
    from ..bench.plan_local import check, plot as draw
    from ..plan.local import local_shapes
    from ..sim.runner import write_json

    modes = _modes(mode, LOCAL_MODES)
    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")
    if model not in ("smollm2-135m", "tiny"):
        raise InputError(f"--model {model!r}: the local preset knows smollm2-135m and tiny")
    local_shapes(engines)
    report = check(model, engines, modes, repeat, progress=lambda s: console.print(s, markup=False, highlight=False))
    table = Table(title=f"plan --local against the runtime ({report['model']}, {report['cpus']} CPUs, "
                        f"{report['repeat']} runs each)")
    for h in ("P/D", "mode", "predicted JCT s", "runtime JCT s (runs)", "error"):
        table.add_column(h, justify="right")
    for r in report["rows"]:
        table.add_row(r["pd"], r["mode"], f"{r['predicted_jct_s']:.1f}",
                      f"{r['runtime_mean_s']:.1f} ({', '.join(f'{x:.1f}' for x in r['runtime_jct_s'])})",
                      f"{r['error'] * 100:+.1f}%")
    out.print(table)
    out.print(f"1P1D against each other shape, same mode: {report['one_p_one_d_agree']} of "
              f"{report['one_p_one_d_pairs']} verdicts agree; all pairs: {report['agree']} of {len(report['pairs'])} "
              f"agree, {report['contradictions']} ordered against the runtime (ties within "
              f"{report['tie_fraction'] * 100:.0f}%)")
    if json_path:
        write_json(report, json_path)
        console.print(f"wrote {json_path}")
    if plot_path:
        console.print(f"wrote {draw(report, plot_path)}")
