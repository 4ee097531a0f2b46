"""`dualpath bench ray-repro`: `dualpath repro` serially and on a local Ray cluster, side by side.

Both runs start from empty output directories (no cached result), on the same code and scale.
Reported: the serial wall time; the Ray run's wall time from before `ray.init` until after
`ray.shutdown` (what a user waits for), of which the start-up (`ray.init` until the executor is
ready) and the shutdown; their ratio (the project's target: <= 0.65 with 2 workers on a 2-core
machine; docs/results/ray/ray_repro_quick.json); and whether every experiment JSON is identical
apart from wall-time fields.

The numbers mean something only on a quiet machine: both runs are CPU-bound on every core."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Sequence

from ...experiments.common import Context, NullProgress
from ...experiments.simrun import code_fingerprint
from ...experiments.suite import run_suite
from ...pool.executor import SerialExecutor

# Wall times and what is computed from them: table3's scheduler cost (policy CPU seconds), the
# report text that prints them, and summary.json's totals.
WALL_KEYS = frozenset({"wall_s", "sim_wall_s", "turns_per_wall_s", "policy_wall_s", "scheduler_cores",
                       "cpu_us_per_decision", "markdown", "wall_s_total"})
WALL_HEADLINE_PREFIX = "scheduler CPU cores"  # table3's headline is a wall-time ratio


def strip_wall(x: Any) -> Any:
    """`x` without wall-time fields (and without headlines that are wall times)."""
    if isinstance(x, dict):
        if str(x.get("metric", "")).startswith(WALL_HEADLINE_PREFIX):
            return None
        return {k: strip_wall(v) for k, v in x.items() if k not in WALL_KEYS}
    if isinstance(x, list):
        return [strip_wall(v) for v in x]
    return x


def differing_outputs(a: Path, b: Path) -> list[str]:
    """Names of the JSON files of `a` that differ from `b`'s apart from wall-time fields."""
    names = sorted(p.name for p in a.glob("*.json"))
    return [n for n in names if not (b / n).is_file()
            or strip_wall(json.loads((a / n).read_text())) != strip_wall(json.loads((b / n).read_text()))]


def run_ray_repro_bench(out_dir: Path, scale: str, names: Sequence[str], num_workers: int) -> dict[str, Any]:
    from .pool import ray_session

    serial_dir, ray_dir = out_dir / "serial", out_dir / "ray"
    for d in (serial_dir, ray_dir):
        shutil.rmtree(d, ignore_errors=True)
    t0 = time.perf_counter()
    run_suite(Context(serial_dir, scale=scale, progress=NullProgress(), executor=SerialExecutor()), names)
    serial_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with ray_session("local", num_workers, code_fingerprint) as executor:
        startup_s = time.perf_counter() - t0
        run_suite(Context(ray_dir, scale=scale, progress=NullProgress(), executor=executor), names)
        t_done = time.perf_counter()
    ray_s = time.perf_counter() - t0
    num_sims = len(list((serial_dir / "cache").glob("*.json")))
    return {"scale": scale, "experiments": list(names), "num_sims": num_sims, "workers": num_workers,
            "cpu_count": os.cpu_count(), "serial_s": serial_s, "ray_s": ray_s, "ray_startup_s": startup_s,
            "ray_shutdown_s": ray_s - (t_done - t0), "ratio": ray_s / serial_s if serial_s > 0 else float("nan"),
            "differing": differing_outputs(serial_dir, ray_dir), "load_avg_1min": os.getloadavg()[0]}
