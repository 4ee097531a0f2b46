"""`dualpath run`: replay a trajectory JSONL, an agentic Mooncake trace or a Mooncake trace against a local cluster."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path
from typing import AsyncContextManager, Callable, Mapping, Sequence

from ...config import EngineConfig, LinkConfig, RuntimeConfig, parse_pd
from ...config.overrides import apply_overrides
from ...metrics.decisions import DecisionLog, decisions_path, write_jsonl
from ...metrics.timeline import Timeline, timeline_path, write_trace
from ...workloads import WorkloadFormat, detect_format, read_agents, read_mooncake
from ..clock import MonotonicClock
from ..cluster import LocalCluster
from .replay import replay_mooncake, replay_trajectories, storage_read_bytes, summarise
from ..router.router import Router

OnTurn = Callable[[str, int, int, Mapping[str, int]], None]  # mode, turns done, total, storage bytes read per node
# A cluster for one mode's config, as an async context manager (run_trace: `clusters`)
ClusterFactory = Callable[[RuntimeConfig], AsyncContextManager[LocalCluster]]


def _per_turn(on_turn: OnTurn | None, mode: str, total: int, router: Router) -> Callable[[int], None] | None:
    return None if on_turn is None else (lambda n: on_turn(mode, n, total, storage_read_bytes(router)))


def trace_config(model: str, pd: str, mode: str, max_len: int, snic_mb_s: float | None, device: str) -> RuntimeConfig:
    """The cluster `run` replays a trace on: the DE's KV cache holds twice the longest prompt."""
    p, d = parse_pd(pd)
    return RuntimeConfig(model=model, num_prefill=p, num_decode=d, mode=mode, device=device,
                         links=LinkConfig(snic_bytes_per_s=None if snic_mb_s is None else snic_mb_s * 1e6),
                         engines=EngineConfig(de_kv_tokens=max(32768, 2 * max_len)))


async def replay_on(cluster: LocalCluster, path: Path, mode: str, limit: int, max_len: int, time_scale: float,
                    on_turn: OnTurn | None = None, decisions: Path | None = None, timeline: Path | None = None) -> dict:
    """Replay the trace's first `limit` agents (trajectory JSONL) or requests (Mooncake) on a
    running cluster; the summary of one mode. `timeline` (a cluster that records them,
    RuntimeConfig.record_timeline): the run's Chrome trace is written to `timeline_path(timeline, mode)`."""
    fmt = detect_format(path)
    clock = MonotonicClock()
    router = cluster.router
    vocab = router.tokenizer.vocab_size
    if decisions is not None:
        router.metrics.decisions = DecisionLog(router.clock.now_s())
    if timeline is not None:
        router.metrics.timeline = Timeline(router.clock.now_s(), router.clock.now_s)
    t0 = time.perf_counter()
    if fmt is not WorkloadFormat.MOONCAKE:  # agents: trajectory JSONL or an agentic trace
        trajs = [t.truncate(max_len) for t in read_agents(path)[:limit]]
        records = await replay_trajectories(router, trajs, [t.arrival_s or 0.0 for t in trajs], vocab, clock,
                                            on_turn=_per_turn(on_turn, mode, sum(len(t.turns) for t in trajs), router))
        n = len(trajs)
    else:
        recs = [r for r in read_mooncake(path) if r.input_tokens + r.output_tokens <= max_len][:limit]
        records = await replay_mooncake(router, recs, vocab, clock, time_scale, on_turn=_per_turn(on_turn, mode, len(recs), router))
        n = len(recs)
    wall = time.perf_counter() - t0
    await asyncio.sleep(0.6)
    result = summarise(records, router.metrics.summary(), wall, n)
    if decisions is not None:
        result["decisions_file"] = str(write_jsonl(router.metrics.decisions.decisions, decisions_path(decisions, mode)))
    if timeline is not None:  # after the sleep above: the engines' last spans came with their last Counters
        trace = router.metrics.timeline.to_chrome("runtime")
        result["timeline_file"] = str(write_trace(trace, timeline_path(timeline, mode)))
    result["mode"] = mode
    return result


def local_cluster(cfg: RuntimeConfig) -> LocalCluster:
    """The default ClusterFactory: the engines as processes of this host (an async context manager)."""
    return LocalCluster(cfg)


async def run_trace(path: Path, model: str, pd: str, modes: list[str], limit: int, max_len: int, time_scale: float,
                    snic_mb_s: float | None, device: str = "cpu",
                    on_turn: OnTurn | None = None, decisions: Path | None = None,
                    timeline: Path | None = None, clusters: ClusterFactory = local_cluster,
                    placement: Mapping[str, str] | None = None, overrides: Sequence[str] = ()) -> dict:
    """One fresh cluster per mode, from `clusters` (deploy/ray/commands.py: ray_clusters for the
    engines as Ray actors; `placement` then names it in the result's config); `on_turn(mode, turns
    done, total, storage bytes read per node)` after every finished turn; `decisions`: every
    scheduling decision of each mode as JSONL (metrics/decisions.py: decisions_path); `timeline`:
    each mode's spans as a Chrome trace (metrics/timeline.py: timeline_path); `overrides`:
    `--set section.field=value` on each mode's RuntimeConfig (config/overrides.py)."""
    detect_format(path)  # neither format: one line before any cluster starts
    cfgs = [apply_overrides(replace(trace_config(model, pd, mode, max_len, snic_mb_s, device),
                                    record_timeline=timeline is not None), list(overrides)) for mode in modes]
    runs = []
    for mode, cfg in zip(modes, cfgs):  # every mode's config checked before any cluster starts
        async with clusters(cfg) as cluster:
            runs.append(await replay_on(cluster, path, mode, limit, max_len, time_scale, on_turn, decisions, timeline))
    transport = cfgs[0].transport
    return {"config": {"model": model, "pd": pd, "trace": str(path), "limit": limit, "max_len": max_len, "device": device,
                       "transport": {"kind": str(transport.kind), "transfer": str(transport.transfer)},
                       **(placement or {})}, "runs": runs}
