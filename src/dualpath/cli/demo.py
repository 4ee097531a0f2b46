"""The demo and what it stands on: `demo`, `calibrate`, `bench demo-robustness | cold | storage-bound`."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..config import DEMO_AGENTS
from ..errors import InputError
from ..progress import reporter
from .io import console, out
from .results import RUNTIME_COLUMNS, print_runs
from .runtime import DeviceOption, TpOption, TransferOption, _device, plot_runtime, tp_config, transfer_overrides


def _plan(model: str, device: str, agents: int, rounds: Optional[int], snic_mb_s: Optional[float]):
    """Calibrate (or reuse the cached profile) and size the demo; one line says what was chosen."""
    from ..runtime.apps.demo import calibrate_for, plan_demo

    if snic_mb_s is not None and snic_mb_s <= 0:
        raise InputError("--snic-mb-s must be positive")
    if agents < 1 or (rounds is not None and rounds < 2):
        raise InputError("--agents must be at least 1 and --rounds at least 2")
    _device(device)
    console.print(f"demo: compute profile of {model} on {device} (measured once per machine, then cached) ...")
    cal, kv_bytes, bt = calibrate_for(model, device)
    plan = plan_demo(cal, kv_bytes, bt, agents, rounds, None if snic_mb_s is None else snic_mb_s * 1e6)
    console.print(f"demo: {rates_line(plan.rates)}; {agents} agents x {len(plan.trajectories[0].turns)} rounds; "
                  f"profile {_provenance(cal)}: {cal.path}")
    return plan


DEFAULT_DEMO_MODES = "basic,dualpath"


def demo_modes(text: str) -> tuple[str, ...]:
    """`--modes`: comma-separated modes (config/features.py: parse_mode names an unknown one), none twice."""
    from ..config import parse_mode

    modes = tuple(m.strip().lower() for m in text.split(",") if m.strip())
    if not modes:
        raise InputError(f"--modes {text!r}: name at least one mode, e.g. {DEFAULT_DEMO_MODES}")
    for m in modes:
        parse_mode(m)
    if len(set(modes)) != len(modes):
        raise InputError(f"--modes {text!r} names a mode twice")
    return modes


def _print_modes(result: dict) -> None:
    """Per mode its JCT, the ratio to basic's (one run's cluster, measured together) and its tokens' digest."""
    runs = {r["mode"]: r for r in result["runs"]}
    if "basic" in runs and "dualpath" in runs:
        b, d = runs["basic"], runs["dualpath"]
        out.print(f"PE busy s per turn: basic {b['pe_busy_s_per_turn']:.3f}, dualpath {d['pe_busy_s_per_turn']:.3f}")
    basic_sha = runs["basic"]["tokens_sha256"] if "basic" in runs else None
    for m, r in runs.items():
        ratio = "" if r["jct_over_basic"] is None or m == "basic" else f"; JCT {m} / basic = {r['jct_over_basic']:.2f}"
        same = "" if basic_sha is None or m == "basic" else (" (basic's)" if r["tokens_sha256"] == basic_sha else " (NOT basic's)")
        out.print(f"{m}: JCT {r['jct_s']:.2f} s{ratio}; tokens_sha256 {r['tokens_sha256'][:16]}{same}")


def _provenance(cal) -> str:
    if not cal.reused:
        return "measured"
    return f"reused, timed again: steps take {cal.speed_now_over_cached:.2f}x as long as when cached, scaled"


def _write_json(result: dict, path: Optional[Path]) -> None:
    from ..sim.runner import write_json

    if path:
        write_json(result, path)
        console.print(f"wrote {path}")


def _write_timelines(result: dict, base: Path) -> None:
    """Each run's trace to `timeline_path(base, mode)`, out of the result (the JSON keeps the path)."""
    from ..metrics.timeline import timeline_path, write_trace
    from ..runtime.apps.demo import runtime_trace

    for r in result["runs"]:
        r["timeline_file"] = str(write_trace(runtime_trace(r), timeline_path(base, r["mode"])))
        console.print(f"wrote {r['timeline_file']}")


def rates_line(rates) -> str:
    return (f"SNIC {rates.snic_bytes_per_s / 1e6:.1f} MB/s per node, CNIC {rates.cnic_bytes_per_s / 1e6:.0f} MB/s "
            f"({rates.source}: hit load = {rates.load_over_compute:.1f}x prefill compute)")


def _title(result: dict, model: str, device: str) -> str:
    r = result["config"]["rates"]
    return (f"local {result['config']['pd']}, {model} on {device}, SNIC {r['snic_bytes_per_s'] / 1e6:.1f} MB/s per node "
            f"({r['source']}, load {r['load_over_compute']:.1f}x compute)")


def demo(
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the result JSON here")] = Path("out/demo.json"),
    plot: Annotated[Optional[Path], typer.Option(help="write a PNG figure here")] = Path("out/demo.png"),
    model: Annotated[str, typer.Option(help="smollm2-135m, tiny, a .gguf file or a safetensors folder")] = "smollm2-135m",
    snic_mb_s: Annotated[Optional[float], typer.Option(help="SNIC cap per node and direction, MB/s (default: derived from this machine's profile)")] = None,
    agents: Annotated[int, typer.Option(help="agents, all starting at t=0")] = DEMO_AGENTS,
    rounds: Annotated[Optional[int], typer.Option(help="rounds per agent (first prompt 190 tokens, then 61 appended, 3 generated; default: sized to this machine)")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    device: DeviceOption = "cpu",
    testbed: Annotated[bool, typer.Option(help="across emulated hosts: network namespaces, tc-enforced links (root)")] = False,
    tp: TpOption = 1,
    ray: Annotated[bool, typer.Option("--ray", help="with --testbed: a Ray node per emulated host, engines as Ray actors, and a kill -9 restart check (needs dualpath[cluster])")] = False,
    timeline: Annotated[Optional[Path], typer.Option(help="write each mode's spans as a Chrome trace (Perfetto), one file per mode: F.json -> F.<mode>.json")] = None,
    transfer: TransferOption = "remote-write",
    modes: Annotated[str, typer.Option(help="comma-separated modes, run in this order on one cluster: basic | dualpath | oracle | dualpath+split | selective (beyond the paper) | basic+layerwise[+de_read][+scheduler]; any +tail, +selective, +dram")] = DEFAULT_DEMO_MODES,
    pd: Annotated[str, typer.Option(help="engines, e.g. 1P2D: each its own emulated node with the SNIC and CNIC rates (`dualpath plan --local` ranks them)")] = "1P1D",
) -> None:
    """Start a local 1P1D cluster (or --pd), replay an agentic workload in basic then dualpath mode (or --modes), compare."""
    from ..config import TransportConfig, parse_pd
    from ..runtime.apps.demo import run_demo

    shape = parse_pd(pd)
    if testbed and shape != (1, 1):
        raise InputError("--pd is not wired on the testbed yet (it runs 1P1D): run without --testbed")
    tp_cfg = tp_config(tp)
    mode_list = demo_modes(modes)
    if testbed and mode_list != demo_modes(DEFAULT_DEMO_MODES):
        raise InputError(f"--modes is not wired on the testbed yet (it runs {DEFAULT_DEMO_MODES}): run without --testbed")
    if ray and not testbed:
        raise InputError("demo --ray runs on the testbed's own Ray nodes: add --testbed (your own cluster: serve --ray ADDRESS)")
    if testbed and timeline is not None:
        raise InputError("--timeline is not written on the testbed (the router runs in its own namespace)")
    remote = transfer_overrides(transfer)  # mooncake: KV as across hosts, on loopback
    if testbed and remote and tp_cfg.ranks > 1:
        raise InputError("--transfer mooncake on the testbed runs engines of one rank each: without --tp")
    if testbed:
        from .testbed import testbed_demo

        return testbed_demo(json_path, plot, model, snic_mb_s, agents, rounds, seed, device, ray, tp_cfg.ranks, transfer)

    plan = _plan(model, device, agents, rounds, snic_mb_s)
    with reporter("demo", "turns", console, snic_bytes_per_s=plan.rates.snic_bytes_per_s) as progress:
        progress.log(f"starting a local {shape[0]}P{shape[1]}D cluster ({model} on {device})")
        transport = TransportConfig(kind="tcp", transfer=transfer) if remote else None
        result = asyncio.run(run_demo(mode_list, model=model, seed=seed, on_turn=progress.update, device=device, plan=plan,
                                   tp=tp_cfg, record_timeline=timeline is not None, transport=transport, pd=shape))
    if timeline is not None:
        _write_timelines(result, timeline)
    console.print(f"demo: {result['config']['cpus']}")
    print_runs(result, _title(result, model, device), 1e6, "MB", RUNTIME_COLUMNS)
    _print_modes(result)
    _write_json(result, json_path)
    if plot:
        plot_runtime(result, plot, f"dualpath demo: {_title(result, model, device)}")
        console.print(f"wrote {plot}")


def calibrate(
    model: Annotated[str, typer.Option()] = "smollm2-135m",
    device: DeviceOption = "cpu",
    force: Annotated[bool, typer.Option(help="measure again even if a cached profile exists")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print the profile as JSON")] = False,
) -> None:
    """Measure (once; then cached) this machine's prefill and decode step times for a model, as a
    prefill engine of the local 1P1D cluster runs it (its CPU set and thread count)."""
    from ..runtime.apps.demo import calibrate_for

    _device(device)
    cal, _, _ = calibrate_for(model, device, force=force, check=False)
    p = cal.profile
    if as_json:
        out.print_json(json.dumps({**p.to_json(), "path": None if cal.path is None else str(cal.path), "reused": cal.reused}))
        return
    out.print(f"profile {'reused' if cal.reused else 'measured'}: {cal.path}")
    out.print(f"  machine {p.key.machine}, {p.key.threads} thread(s), {p.key.device}")
    for s in p.prefill:
        out.print(f"  prefill {s.tokens:5d} new over {s.context_tokens:5d} cached: {s.seconds * 1e3:8.1f} ms "
                  f"(fit {p.prefill_s(s.tokens, s.context_tokens) * 1e3:8.1f})")
    for s in p.decode:
        out.print(f"  decode batch {s.tokens:2d} at context {s.context_tokens:5d}: {s.seconds * 1e3:8.1f} ms "
                  f"(fit {p.decode_step_s(s.tokens, s.context_tokens) * 1e3:8.1f})")


def bench_demo_robustness(
    hogs: Annotated[str, typer.Option(help="comma-separated numbers of CPU hogs, one demo each")] = "0,1,2",
    model: Annotated[str, typer.Option()] = "smollm2-135m",
    json_path: Annotated[Optional[Path], typer.Option("--json")] = Path("out/demo_robustness.json"),
    plot: Annotated[Optional[Path], typer.Option()] = Path("out/demo_robustness.png"),
    device: DeviceOption = "cpu",
) -> None:
    """The demo quiet and beside 1 and 2 CPU hogs (`yes > /dev/null`), the same derived rates for
    all: JCT ratio, SNIC utilisation while reading, PE busy seconds per turn."""
    from ..runtime.apps.demo_bench import plot_robustness, run_robustness

    try:
        counts = [int(x) for x in hogs.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--hogs: expected comma-separated integers, got {hogs!r}") from None
    if not counts or min(counts) < 0:
        raise InputError("--hogs needs at least one count >= 0")
    plan = _plan(model, device, DEMO_AGENTS, None, None)
    with reporter("demo-robustness", "turns", console, snic_bytes_per_s=plan.rates.snic_bytes_per_s) as progress:
        report = run_robustness(plan, counts, model, device, on_turn=progress.update)
    out.print(f"rates: {rates_line(plan.rates)}; {report['workload']['num_agents']} agents x {report['workload']['rounds']} rounds")
    out.print("hogs  JCT basic s  JCT dualpath s  ratio  SNIC util while reading (dualpath)  PE busy s/turn basic, dualpath")
    for r in report["runs"]:
        util = ", ".join(f"{v:.2f}" if v is not None else "-" for v in r["snic_util_while_reading_dualpath"].values())
        busy = r["pe_busy_s_per_turn"]
        out.print(f"{r['hogs']:4d}  {r['jct_basic_s']:11.1f}  {r['jct_dualpath_s']:14.1f}  {r['ratio']:5.2f}  {util:>35}  "
                  f"{busy['basic']:.3f}, {busy['dualpath']:.3f}")
    _write_json(report, json_path)
    if plot:
        plot_robustness(report, plot)
        console.print(f"wrote {plot}")


def bench_cold(
    rounds: Annotated[int, typer.Option(help="fresh 254-token prompts per agent (nothing hits the store)")] = 8,
    model: Annotated[str, typer.Option()] = "smollm2-135m",
    json_path: Annotated[Optional[Path], typer.Option("--json")] = Path("out/demo_cold.json"),
    device: DeviceOption = "cpu",
) -> None:
    """The demo's cluster and rates on a workload with nothing to load: what layerwise prefill
    and quota batching cost when there is no KV to move."""
    from ..runtime.apps.demo import run_demo

    if rounds < 1:
        raise InputError("--rounds must be at least 1")
    plan = _plan(model, device, DEMO_AGENTS, None, None)
    with reporter("cold", "turns", console, snic_bytes_per_s=plan.rates.snic_bytes_per_s) as progress:
        result = asyncio.run(run_demo(model=model, device=device, plan=plan, cold_rounds=rounds, on_turn=progress.update))
    print_runs(result, f"cold workload (nothing to load), {_title(result, model, device)}", 1e6, "MB", RUNTIME_COLUMNS)
    runs = {r["mode"]: r for r in result["runs"]}
    out.print(f"JCT dualpath / basic = {runs['dualpath']['jct_s'] / runs['basic']['jct_s']:.2f}")
    _write_json(result, json_path)


def bench_model_speed(
    threads: Annotated[int, typer.Option(help="torch threads")] = 1,
    repeats: Annotated[int, typer.Option(help="paired repeats: every run once each, the order alternating")] = 5,
    prompt_tokens: Annotated[int, typer.Option(help="the prompt prefilled, and held by each decoded sequence")] = 1024,
    decode_batch: Annotated[int, typer.Option(help="sequences per decode step")] = 8,
    decode_tokens: Annotated[int, typer.Option(help="decode steps per run")] = 32,
    profile: Annotated[bool, typer.Option(help="add torch.profiler's top operators of our prefill and decode step")] = False,
    model: Annotated[str, typer.Option(help="a built-in model (transformers is compared for smollm2-135m)")] = "smollm2-135m",
    device: DeviceOption = "cpu",
    json_path: Annotated[Path, typer.Option("--json")] = Path("out/bench/model_speed.json"),
    plot: Annotated[Optional[Path], typer.Option(help="a PNG of ours / transformers, median and min-max")] = None,
) -> None:
    """Our SmolLM2 prefill and decode against transformers' on the same weights, machine and
    threads, in paired repeats: each ratio's median with its min and max."""
    from ..bench.model_speed import model_speed, plot_model_speed

    if min(threads, repeats, prompt_tokens, decode_batch, decode_tokens) < 1:
        raise InputError("--threads, --repeats, --prompt-tokens, --decode-batch and --decode-tokens must be at least 1")
    from ..runtime.model import BUILTIN_MODELS

    if model not in BUILTIN_MODELS:
        raise InputError(f"--model: one of {', '.join(sorted(BUILTIN_MODELS))}, got {model!r}")
    r = model_speed(model, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens, batch=decode_batch, threads=threads,
                    repeats=repeats, profile=profile, device=_device(device))
    _print_model_speed(r)
    _write_json(r, json_path)
    if plot:
        plot_model_speed(r, plot)
        console.print(f"wrote {plot}")


def _print_model_speed(r: dict) -> None:
    from rich.table import Table

    out.print(f"{r['model']}, {r['threads']} thread(s), {r['prompt_tokens']}-token prompt, decode batch "
              f"{r['decode_batch']} x {r['decode_tokens']} steps, {r['repeats']} paired repeats, torch {r['torch']}, "
              f"transformers {r['transformers']}")
    out.print("tokens/s (median): " + ", ".join(f"{n} {v:,.1f}" for n, v in r["summary"]["tokens_per_s"].items()))
    table = Table()
    for col in ("ours", "over", "median", "min-max"):
        table.add_column(col, justify="right")
    for c in r["summary"]["ratios"]:
        table.add_row(c["ours"], c["theirs"], f"{c['median']:.2f}", f"{c['min']:.2f}-{c['max']:.2f}")
    out.print(table)
    for run, ops in r.get("profile", {}).items():
        out.print(f"{run}: " + ", ".join(f"{o['op']} {o['ms']:.1f} ms ({o['share']:.0%})" for o in ops))
