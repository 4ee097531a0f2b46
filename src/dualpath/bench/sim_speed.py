"""Simulator speed benchmark (`dualpath bench sim-speed`): wall time and simulated turns per
second by agent count; one process, runs in sequence, nothing else should load the machine.

Turns per second depend on the machine and on its load at the time; beside them each row gives
the machine's own speed at a fixed pure-Python task measured just before and just after the
simulation (`heap_ops_per_s`: push and pop on a binary heap, the simulator's inner loop), and
turns per million of those heap operations, which compares runs made on different machines or on
one machine at different speeds."""

from __future__ import annotations

import heapq
import random
import time
from pathlib import Path
from typing import Any

from .._build import build_kind
from ..config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from ..parsing import parse_tokens
from ..sim.runner import load_trajectories, write_json
from ..sim.simulator import Simulator


HEAP_SIZE = 10_000  # events pending at once: the order of a 2P4D run's event heap
HEAP_OP_PAIRS = 500_000  # ~0.5 s on a 2026 cloud core


def heap_ops_per_s() -> float:
    """This machine's speed now at heapq push + pop on a heap of HEAP_SIZE floats (deterministic keys)."""
    rng = random.Random(1)
    heap = [rng.random() for _ in range(HEAP_SIZE)]
    heapq.heapify(heap)
    steps = [rng.random() for _ in range(HEAP_OP_PAIRS)]
    t0 = time.perf_counter()
    for step in steps:
        heapq.heappush(heap, heapq.heappop(heap) + step)
    return 2 * HEAP_OP_PAIRS / (time.perf_counter() - t0)


def run_speed_bench(model: str, pd: str, max_len: str, counts: list[int], mode: str, seed: int,
                    json_path: Path | None, plot: Path | None) -> list[dict[str, Any]]:
    rows = []
    cluster = paper_cluster(model, pd)
    for n in counts:
        cfg = SimConfig(cluster=cluster, workload=WorkloadConfig(max_len_tokens=parse_tokens(max_len), num_agents=n, seed=seed))
        trajs, arrivals = load_trajectories(cfg)
        before = heap_ops_per_s()
        r = Simulator(cfg, parse_mode(mode), trajs, arrivals).run()
        machine = (before + heap_ops_per_s()) / 2
        # turns per million events (each one push and one pop of the event heap): the machine-independent
        # half of the speed, which tests/sim/test_sim_event_budget.py holds to a floor
        rows.append({"agents": n, "num_turns": r["num_turns"], "num_events": r["num_events"], "wall_s": r["wall_s"],
                     "turns_per_wall_s": r["turns_per_wall_s"],
                     "turns_per_million_events": r["num_turns"] / r["num_events"] * 1e6,
                     "heap_ops_per_s_before": before, "heap_ops_per_s": machine,
                     "turns_per_million_heap_ops": r["turns_per_wall_s"] / machine * 1e6,
                     "jct_s": r["jct_s"], "build": r["build"]})
    if json_path:
        from ..experiments.simrun import code_fingerprint

        write_json({"model": model, "pd": pd, "max_len": max_len, "mode": mode, "build": build_kind(),
                    "simulator_code": code_fingerprint(), "rows": rows}, json_path)
    if plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.plot([r["num_turns"] for r in rows], [r["wall_s"] for r in rows], "o-")
        for r in rows:
            ax.annotate(f"{r['agents']} agents", (r["num_turns"], r["wall_s"]), fontsize=8)
        ax.set_xlabel("simulated turns")
        ax.set_ylabel("wall time (s)")
        ax.set_title(f"simulator speed ({model} {pd} {max_len} {mode}, {build_kind()} build)")
        fig.tight_layout()
        Path(plot).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(plot, dpi=120)
        plt.close(fig)
    return rows
