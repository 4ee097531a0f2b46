"""Run a sweep: every grid point one simulation (experiments/simrun.run_spec, as `dualpath repro`
runs them), cached under OUT/cache by the repro's key (spec, seed, simulator code), so a rerun or
a larger grid reuses what is there; then one row per point.

On a parallel executor each seed's missing points go out as one batch (experiments/batch.py);
serially they run one after another. Either way the rows are the same numbers, apart from
`wall_s` (the simulator is deterministic)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..experiments.batch import simulate_many
from ..experiments.common import Context, ProgressSink
from ..pool.executor import Executor
from .spec import SweepSpec

COLUMNS = ("model", "pd", "max_len_tokens", "agents", "mode", "seed", "tool_time_s", "jct_s", "ttft_p50_s", "ttft_p90_s",
           "ttft_p99_s", "tpot_mean_s", "snic_max_over_avg", "num_turns", "wall_s")


def run_sweep(spec: SweepSpec, out_dir: Path, executor: Executor, progress: ProgressSink,
              use_cache: bool = True) -> list[dict[str, Any]]:
    """One row per grid point, in grid order (SweepSpec.points)."""
    points = spec.points()
    rows: dict[int, dict[str, Any]] = {}
    for seed in spec.seeds:
        ctx = Context(out_dir, seed=seed, progress=progress, use_disk_cache=use_cache, executor=executor)
        index = [i for i, p in enumerate(points) if p.seed == seed]
        for i, result in zip(index, simulate_many(ctx, [points[i].spec for i in index])):
            rows[i] = row(points[i].spec, seed, result)
    return [rows[i] for i in range(len(points))]


def row(spec: Any, seed: int, r: dict[str, Any]) -> dict[str, Any]:
    return {"model": spec.model, "pd": spec.pd, "max_len_tokens": spec.max_len_tokens, "agents": spec.num_agents,
            "mode": spec.mode, "seed": seed, "tool_time_s": spec.tool_time_s, "jct_s": r["jct_s"], "ttft_p50_s": r["ttft_s"]["p50"],
            "ttft_p90_s": r["ttft_s"]["p90"], "ttft_p99_s": r["ttft_s"]["p99"], "tpot_mean_s": r["tpot_s"]["mean"],
            "snic_max_over_avg": r["snic_max_over_avg"], "num_turns": r["num_turns"], "wall_s": r["wall_s"]}
