"""`dualpath bench sim-speed | lanes | transport | store`: benchmarks that print and save their
figures (the demo's are in demo.py). The measuring code is in the bench/ package."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..config import RuntimeConfig, parse_mode
from ..errors import InputError
from .io import console, out, say_build
from .sim import _positive, _split_ints


def bench_sim_speed(
    agents: Annotated[str, typer.Option(help="comma-separated agent counts")] = "512,1024,2048,4096",
    model: Annotated[str, typer.Option()] = "ds-v3.2-660b",
    pd: Annotated[str, typer.Option()] = "2P4D",
    max_len: Annotated[str, typer.Option()] = "64k",
    mode: Annotated[str, typer.Option(help="one mode")] = "dualpath",
    seed: Annotated[int, typer.Option()] = 1,
    builds: Annotated[Optional[str], typer.Option(help="side by side, each in a child process: pure, compiled or "
                                                  "pure,compiled (default: the build this process runs, alone)")] = None,
    against: Annotated[Optional[Path], typer.Option(help="also another checkout's src/ folder, in the build it runs "
                                                    "(older code: git worktree add DIR REV, then DIR/src)")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
    plot: Annotated[Optional[Path], typer.Option()] = None,
) -> None:
    """Simulator speed: wall time and simulated turns per second by agent count; with --builds or
    --against, several builds or checkouts side by side in one run."""
    from .._build import PACKAGE_DIR, build_kind
    from ..bench.sim_speed import run_speed_bench, side_by_side, variants

    counts = [_positive(int(a), "--agents") for a in _split_ints(agents)]
    parse_mode(mode)
    columns = ["agents", "turns", "events", "turns / M events", "wall s", "turns/s", "machine M heap ops/s",
               "turns / M heap ops", "JCT s"]
    if builds is None and against is None:
        say_build()
        rows = run_speed_bench(model, pd, max_len, counts, mode, seed, json_path, plot)
        title = f"simulator speed: {model} {pd} {max_len} {mode} ({rows[0]['build'] if rows else build_kind()} build)"
    else:
        vs = variants([b.strip() for b in (builds or build_kind()).split(",")], PACKAGE_DIR.parent,
                      against.resolve() if against else None)
        rows = side_by_side(model, pd, max_len, counts, mode, seed, vs, json_path, plot)["rows"]
        title, columns = f"simulator speed: {model} {pd} {max_len} {mode}", ["variant", *columns]
    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(*([r["variant"]] if "variant" in r else []),
                      str(r["agents"]), str(r["num_turns"]), str(r["num_events"]), f"{r['turns_per_million_events']:.0f}",
                      f"{r['wall_s']:.1f}", f"{r['turns_per_wall_s']:.0f}", f"{r['heap_ops_per_s'] / 1e6:.2f}",
                      f"{r['turns_per_million_heap_ops']:.0f}", f"{r['jct_s']:.0f}")
    out.print(table)
    if json_path:
        console.print(f"wrote {json_path}")


def bench_lanes(
    duration_s: Annotated[float, typer.Option()] = 2.0,
    link_gb_s: Annotated[float, typer.Option(help="emulated link rate, GB/s")] = 1.0,
    chunk_kib: Annotated[int, typer.Option(help="KV chunk size, KiB")] = 8,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
    testbed: Annotated[bool, typer.Option("--testbed", help="across emulated hosts, through the kernel's classes (root)")] = False,
    cnic_mb_s: Annotated[float, typer.Option(help="--testbed: the CNIC rate, MB/s")] = 32.0,
    bursts: Annotated[int, typer.Option(help="--testbed: bursts per run")] = 400,
    bulk: Annotated[str, typer.Option(help="--testbed: the KV load, tcp (a CS1-marked sender) or mooncake "
                                      "(Mooncake Transfer Engine writes, unmarked)")] = "tcp",
    plot: Annotated[Optional[Path], typer.Option(help="--testbed / --sim: write a PNG figure here")] = None,
    sim: Annotated[bool, typer.Option("--sim", help="in the simulator: the MoE preset's EP bursts on the CNICs, "
                                      "TPOT with two classes vs one, with and without a KV flood")] = False,
    model: Annotated[str, typer.Option(help="--sim: an MoE model")] = "ds-v3.2-660b",
    pd: Annotated[str, typer.Option(help="--sim: P/D shape (EP spans a role's nodes)")] = "2P4D",
    agents: Annotated[int, typer.Option(help="--sim: agents")] = 1024,
    max_len: Annotated[str, typer.Option(help="--sim: trajectory MaxLen")] = "64k",
) -> None:
    """64 KiB latency-critical bursts every 5 ms over a saturated KV lane: lanes vs one FIFO."""
    from ..bench.lanes import run_lanes_bench
    from ..sim.runner import write_json

    if testbed:
        from .testbed import lanes_bench

        return lanes_bench(cnic_mb_s, bursts, json_path, plot, bulk)
    if bulk != "tcp":
        raise InputError("--bulk is a --testbed option")
    if sim:
        return _lanes_sim(model, pd, agents, max_len, json_path, plot)

    rows = {}
    for fifo in (False, True):
        rows["fifo" if fifo else "lanes"] = run_lanes_bench(duration_s, link_gb_s * 1e9, fifo=fifo, chunk_bytes=chunk_kib * 1024)
    table = Table(title=f"lanes bench: {link_gb_s} GB/s link, {chunk_kib} KiB KV chunks")
    keys = [k for k in rows["lanes"] if isinstance(rows["lanes"][k], (int, float))]
    table.add_column("metric")
    table.add_column("lanes", justify="right")
    table.add_column("one FIFO", justify="right")
    for k in keys:
        table.add_row(k, f"{rows['lanes'][k]:.6g}", f"{rows['fifo'][k]:.6g}")
    out.print(table)
    if json_path:
        write_json(rows, json_path)

def _lanes_sim(model: str, pd: str, agents: int, max_len: str, json_path: Optional[Path], plot: Optional[Path]) -> None:
    from ..bench.lanes_sim import plot_lanes_sim, run_lanes_sim
    from ..costmodel.ep_traffic import MOE_SHAPES
    from ..sim.runner import write_json
    from .sim import build_sim_config

    if model not in MOE_SHAPES:
        raise InputError(f"--sim needs an MoE model (its EP traffic is what the lanes protect): {', '.join(MOE_SHAPES)}")
    result = run_lanes_sim(build_sim_config(model, pd, max_len, agents, 1, None, None), progress=out.print)
    table = Table(title=f"EP bursts on the CNICs: {model} {result['pd']}, {agents} agents, dualpath (sim)")
    for col in ("KV on the CNICs", "EP bursts see", "TPOT mean ms", "TPOT / ref.", "TTFT p50 s", "JCT s"):
        table.add_column(col, justify="right")
    for kv, rows in result["kv"].items():
        for name, r in rows.items():
            table.add_row(kv, name, f"{r['tpot_mean_s'] * 1e3:.3f}", f"{r['tpot_over_reference']:.4f}",
                          f"{r['ttft_p50_s']:.3f}", f"{r['jct_s']:.0f}")
    out.print(table)
    if json_path:
        write_json(result, json_path)
    if plot:
        plot_lanes_sim(result, plot)


def bench_transport(
    total_mib: Annotated[int, typer.Option(help="bytes per transfer per size per round, MiB (whole Full Blocks)")] = 256,
    block_mib: Annotated[Optional[float], typer.Option(help="one more block size, MiB, besides the model's two")] = None,
    rounds: Annotated[int, typer.Option(help="alternating rounds: every transfer at every size each round")] = 5,
    latency_blocks: Annotated[Optional[int], typer.Option(
        help="blocks timed one at a time per size per round [default: bench.transport_run.LATENCY_BLOCKS_DEFAULT]")] = None,
    chunk_kib: Annotated[Optional[int], typer.Option(
        help="the engines' link chunk, KiB [default: bench.transport.REAL_SPEED_CHUNK_BYTES]")] = None,
    model: Annotated[str, typer.Option(help="whose KV block sizes: a built-in model or a .gguf file")] = RuntimeConfig().model,
    json_path: Annotated[Path, typer.Option("--json")] = Path("out/bench/transport.json"),
    plot: Annotated[Optional[Path], typer.Option(help="a PNG of rates and latencies by transfer and size")] = None,
) -> None:
    """Four KV transfers side by side: Mooncake Transfer Engine and our remote writes (loopback TCP),
    shared memory between two engine processes, in-process memcpy; the model's block sizes."""
    from ..bench.transport import REAL_SPEED_CHUNK_BYTES
    from ..bench.transport_run import LATENCY_BLOCKS_DEFAULT, block_sizes, model_layout, plot_transport, run_transport_bench
    from ..sim.runner import write_json

    latency_blocks = LATENCY_BLOCKS_DEFAULT if latency_blocks is None else latency_blocks
    chunk_kib = REAL_SPEED_CHUNK_BYTES // 1024 if chunk_kib is None else chunk_kib
    if min(total_mib, rounds, latency_blocks, chunk_kib) < 1 or (block_mib is not None and block_mib <= 0):
        raise InputError("--total-mib, --rounds, --latency-blocks and --chunk-kib must be >= 1, --block-mib positive")
    cfg = RuntimeConfig(model=model)
    layout = model_layout(cfg)
    sizes = block_sizes(layout, None if block_mib is None else int(block_mib * 2**20))
    total_bytes = total_mib * 2**20 // layout.full_block_bytes * layout.full_block_bytes
    if total_bytes < max(sizes.values()):
        raise InputError(f"--total-mib {total_mib} holds no whole block of {max(sizes.values()) / 2**20:.2f} MiB")
    r = run_transport_bench(sizes, total_bytes, rounds, chunk_kib * 1024, latency_blocks)
    r.update(model=model, block_tokens=layout.block_tokens, num_layers=layout.num_layers,
             kv_bytes_per_token_per_layer=layout.kv_bytes_per_token_per_layer, kv_dtype=str(cfg.kv_dtype))
    _print_transport(r)
    write_json(r, json_path)
    console.print(f"wrote {json_path}")
    if plot:
        plot_transport(r, plot)
        console.print(f"wrote {plot}")


def _print_transport(r: dict) -> None:
    table = Table(title=f"{r['model']} KV blocks, {r['total_bytes'] / 2**20:.1f} MiB per transfer per size per round, "
                        f"{r['rounds']} rounds, {r['chunk_bytes'] // 1024} KiB link chunks, {r['cpus']} CPUs")
    for col in ("transfer", "block", "GB/s (median)", "min-max", "vs memcpy", "latency p50 us", "p90 us", "intact"):
        table.add_column(col, justify="right")
    for t, by_size in r["rows"].items():
        for size, c in by_size.items():
            table.add_row(t, f"{size} {c['block_bytes'] / 1024:,.0f} KiB", f"{c['gbps_median']:.2f}",
                          f"{c['gbps_min']:.2f}-{c['gbps_max']:.2f}", f"{c['ratio_to_memcpy']:.2f}",
                          f"{c['latency_p50_us']:,.0f}", f"{c['latency_p90_us']:,.0f}", "yes" if c["intact"] else "NO")
    out.print(table)
    for line in r["notes"]:
        out.print(line)


def bench_store(
    directory: Annotated[Path, typer.Option(help="where to write the test store (same disk as your KV store)")] = Path("out/bench-store"),
    total_mib: Annotated[int, typer.Option()] = 1024,
    threads: Annotated[int, typer.Option()] = 4,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
    service: Annotated[bool, typer.Option("--service", help="the storage service vs the local store instead")] = False,
    rounds: Annotated[int, typer.Option(help="--service: alternating rounds per cache state")] = 3,
) -> None:
    """KV store reads vs a direct (O_DIRECT) sequential read of a same-size file, side by side;
    with --service, gets from `dualpath store serve` vs the local store on the same disk."""
    from ..core.blocks import BlockLayout
    from ..bench.store import run_store_bench
    from ..bench.store_service import run_service_bench
    from ..sim.runner import write_json

    if total_mib < 1 or threads < 1 or rounds < 1:
        raise InputError("--total-mib, --threads and --rounds must be >= 1")
    layout = BlockLayout(30, 64, 2 * 3 * 64 * 4)  # SmolLM2-135M, float32 KV
    directory.mkdir(parents=True, exist_ok=True)
    if service:
        r = run_service_bench(directory, total_mib * 2**20, layout, threads, rounds=rounds)
    else:
        r = run_store_bench(directory, total_mib * 2**20, layout, threads)
    out.print_json(json.dumps(r, default=str))
    if json_path:
        write_json(r, json_path)


def bench_overload(
    model: Annotated[str, typer.Option(help="the served model (tiny: the HTTP front, not the engines, is the bottleneck)")] = "smollm2-135m",
    inflight: Annotated[int, typer.Option(help="the server's --max-inflight-requests")] = 4,
    clients: Annotated[Optional[int], typer.Option(
        help="closed-loop clients of the capacity phase, more than --inflight (default: 2 x --inflight)")] = None,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
) -> None:
    """A real server at its capacity (a closed loop of more clients than its in-flight limit), then
    3x it (open loop): 429s, their latency, admitted TTFT p90 against capacity's, nothing lost."""
    import asyncio

    from ..bench.overload import CLIENTS_PER_LIMIT, run_overload
    from ..sim.runner import write_json

    if inflight < 1:
        raise InputError("--inflight must be positive")
    clients = CLIENTS_PER_LIMIT * inflight if clients is None else clients
    if clients <= inflight:
        raise InputError(f"--clients must exceed --inflight ({inflight}), got {clients}: "
                         "capacity is measured above the limit")
    r = asyncio.run(run_overload(model, inflight, clients))
    for name in ("capacity", "overload"):
        s = r[name]
        out.print(f"{name:9s}: {s['requests']} requests, {s['finished']} finished, {s['refused_429']} refused (429), "
                  f"{s['lost']} lost, {s['short']} short; {s['throughput_per_s']:.1f} finished/s; TTFT p50 "
                  f"{s['ttft_p50_s'] * 1e3:.0f} ms, p90 {s['ttft_p90_s'] * 1e3:.0f} ms; 429 p99 {s['refusal_p99_s'] * 1e3:.1f} ms")
    out.print(f"offered {r['overload_rate_per_s']:.1f} req/s (3x capacity); admitted TTFT p90 / capacity's = "
              f"{r['ttft_p90_over_capacity']:.2f}")
    if json_path:
        write_json(r, json_path)


def bench_soak(
    model: Annotated[str, typer.Option(help="the served model")] = "smollm2-135m",
    minutes: Annotated[float, typer.Option(help="the soak's length at LOAD_FRACTION of capacity")] = 30.0,
    sample_s: Annotated[float, typer.Option(help="seconds between samples of statuses, latency, RSS and fds")] = 60.0,
    clients: Annotated[int, typer.Option(help="closed-loop clients measuring the capacity")] = 4,
    seed: Annotated[int, typer.Option()] = 0,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
    plot: Annotated[Optional[Path], typer.Option(help="a PNG of latency, RSS and open fds over time")] = None,
) -> None:
    """A real server at about 70% of its measured capacity for --minutes, with a mix of streamed and
    plain requests, logprobs, cache salts, disconnects and cancels: errors by code, TTFT and TPOT
    over time, the server's RSS and open fds per sample; exit 1 when a check fails."""
    import asyncio

    from ..bench.soak import plot_soak, run_soak
    from ..sim.runner import write_json

    if minutes <= 0 or sample_s <= 0 or clients < 1:
        raise InputError("--minutes and --sample-s must be positive, --clients at least 1")
    r = asyncio.run(run_soak(model, minutes, sample_s, clients, seed=seed))
    out.print(f"capacity {r['capacity_per_s']:.2f} finished/s; soak at {r['rate_per_s']:.2f} req/s for {minutes:g} min")
    for s in r["samples"][1:]:
        out.print(f"{s['t_s'] / 60:5.1f} min: {s['requests']:4d} sent {s['statuses']}; TTFT p50 {s['ttft_p50_s'] * 1e3:.0f} ms "
                  f"p90 {s['ttft_p90_s'] * 1e3:.0f} ms; TPOT p50 {s['tpot_p50_s'] * 1e3:.1f} ms; "
                  f"RSS {s['rss_bytes'] / 2**20:.0f} MiB ({s['private_bytes'] / 2**20:.0f} not shared); {s['open_fds']} fds")
    c = r["checks"]
    out.print(f"5xx {c['responses_5xx']}, lost {c['lost']}, incomplete 200 {c['incomplete_200']}, cached across salts "
              f"{c['cached_across_salts']} of {c['first_turns_under_a_new_salt']}, in flight after {c['server_inflight_after_drain']:g}; "
              f"RSS end / baseline {c['rss_end_over_baseline']:.3f} (not shared {c['private_end_over_baseline']:.3f}); fds {c['open_fds_baseline']} -> {c['open_fds_end']}: "
              f"{'passed' if c['passed'] else 'FAILED'}")
    if json_path:
        write_json(r, json_path)
    if plot:
        plot_soak(r, plot)
    if not c["passed"]:
        raise typer.Exit(1)


def bench_salts(
    model: Annotated[str, typer.Option(help="the served model")] = "smollm2-135m",
    prompts: Annotated[int, typer.Option(help="distinct prompts, each sent cold, under another salt, and as a hit")] = 12,
    prompt_tokens: Annotated[int, typer.Option(help="random token ids per prompt (whole 64-token blocks)")] = 1024,
    seed: Annotated[int, typer.Option()] = 0,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
    plot: Annotated[Optional[Path], typer.Option()] = None,
) -> None:
    """The side channel a shared KV store opens, and the cache salt that closes it: TTFT of a cold
    prompt, of the same prompt under another salt, and of a hit under its own salt."""
    import asyncio

    from ..bench.salts import GROUPS, plot_salts, run_salts
    from ..sim.runner import write_json

    if prompts < 2 or prompt_tokens < 64:
        raise InputError("--prompts must be at least 2 and --prompt-tokens at least one 64-token block")
    r = asyncio.run(run_salts(model, prompts, prompt_tokens, seed))
    s = r["summary"]
    for g in GROUPS:
        out.print(f"{g:10s}: TTFT p50 {s[g]['ttft_p50_s'] * 1e3:.0f} ms (p10 {s[g]['ttft_p10_s'] * 1e3:.0f}, "
                  f"p90 {s[g]['ttft_p90_s'] * 1e3:.0f}); cached tokens {s[g]['cached_tokens']}")
    out.print(f"another salt / cold = {s['other_salt_over_cold']:.3f} (within the cold spread: "
              f"{s['other_salt_within_cold_spread']}); hit / cold = {s['hit_over_cold']:.3f}")
    if json_path:
        write_json(r, json_path)
    if plot:
        plot_salts(r, plot)


def bench_ray_repro(
    out_dir: Annotated[Path, typer.Option("--out", help="serial/ and ray/ repro outputs, bench.json")] = Path("out/bench-ray-repro"),
    scale: Annotated[str, typer.Option(help="quick (`repro --quick`), smoke (seconds) or full")] = "quick",
    only: Annotated[Optional[list[str]], typer.Option("--only", help="these experiments only (repeat)")] = None,
    workers: Annotated[int, typer.Option(help="CPUs of the local Ray cluster")] = 2,
) -> None:
    """`repro` serially, then on a local Ray cluster (start-up included): wall times, ratio, identity."""
    from ..deploy.ray.repro_bench import run_ray_repro_bench
    from ..experiments.common import SCALES
    from ..experiments.suite import resolve_names
    from ..sim.runner import write_json

    if scale not in SCALES:
        raise InputError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    r = run_ray_repro_bench(out_dir, scale, resolve_names(only), _positive(workers, "--workers"))
    table = Table(title=f"repro ({scale}) serial vs a local Ray of {workers} workers: {r['num_sims']} simulations")
    for col in ("serial s", "Ray s (all)", "Ray start-up s", "Ray shutdown s", "Ray / serial", "JSONs identical"):
        table.add_column(col, justify="right")
    table.add_row(f"{r['serial_s']:.1f}", f"{r['ray_s']:.1f}", f"{r['ray_startup_s']:.1f}", f"{r['ray_shutdown_s']:.1f}",
                  f"{r['ratio']:.2f}", "yes" if not r["differing"] else "no: " + ", ".join(r["differing"]))
    out.print(table)
    write_json(r, out_dir / "bench.json")


def bench_checksum(
    seconds: Annotated[float, typer.Option(help="per (function, size)")] = 0.6,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
) -> None:
    """Checksums over KV-block-sized buffers, GB/s per installed function and size (bench/checksum.py)."""
    from ..bench.checksum import SIZES, run_checksum_bench
    from ..sim.runner import write_json

    if seconds <= 0:
        raise InputError(f"--seconds must be positive, got {seconds}")
    r = run_checksum_bench(seconds)
    table = Table(title="checksum GB/s by buffer (best of 3 rounds, one thread)")
    table.add_column("function")
    for size in SIZES:
        table.add_column(size, justify="right")
    for name, row in r["gbps"].items():
        table.add_row(name, *(f"{row[s]:.2f}" for s in SIZES))
    out.print(table)
    out.print(f"fastest over every size (best worst-case ratio to the best): {r['winner']}")
    if json_path:
        write_json(r, json_path)


def bench_remote_write(
    total_mib: Annotated[int, typer.Option()] = 1024,
    chunk_mib: Annotated[float, typer.Option()] = 1.0,
    region_mib: Annotated[int, typer.Option(help="the host buffer written into, cycled")] = 256,
    repeat: Annotated[int, typer.Option(help="runs per way; the best counts")] = 3,
    json_path: Annotated[Optional[Path], typer.Option("--json")] = None,
) -> None:
    """Remote writes over loopback TCP against memcpy into shared memory (bench/remote_write.py)."""
    from ..bench.remote_write import MIB, run_remote_write_bench
    from ..sim.runner import write_json

    r = run_remote_write_bench(total_mib * MIB, int(chunk_mib * MIB), region_mib * MIB, repeat)
    base = r["rows"]["memcpy"]["gb_per_s"]
    table = Table(title=f"{total_mib} MiB in {chunk_mib:g} MiB chunks, best of {repeat}, loopback, {r['cpus']} CPUs")
    for col in ("way", "seconds", "GB/s", "vs memcpy"):
        table.add_column(col, justify="right")
    for name, row in r["rows"].items():
        table.add_row(name, f"{row['seconds']:.3f}", f"{row['gb_per_s']:.2f}", f"{row['gb_per_s'] / base:.2f}")
    out.print(table)
    if json_path:
        write_json(r, json_path)
