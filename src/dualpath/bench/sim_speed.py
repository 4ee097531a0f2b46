"""Simulator speed benchmark (`dualpath bench sim-speed`): wall time and simulated turns per
second by agent count; one process, runs in sequence, nothing else should load the machine.

`side_by_side` runs the same benchmark once per variant, each in a child process: this tree's
builds (`pure`, `compiled`: `DUALPATH_BUILD`, src/dualpath/_build.py) and, with `against`, another
checkout's `src/` (older code, say) in whichever build it runs, agent count by agent count with the
variants interleaved, so a machine that slows down slows every variant alike.

Turns per second depend on the machine and on its load at the time; beside them each row gives
the machine's own speed at a fixed pure-Python task measured just before and just after the
simulation (`heap_ops_per_s`: push and pop on a binary heap, the simulator's inner loop), and
turns per million of those heap operations, which compares runs made on different machines or on
one machine at different speeds."""

from __future__ import annotations

import heapq
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._build import build_kind
from ..config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from ..errors import InputError
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
        _plot(rows, plot, f"simulator speed ({model} {pd} {max_len} {mode}, {build_kind()} build)", lambda r: "")
    return rows


def _plot(rows: list[dict[str, Any]], plot: Path, title: str, label_of) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    for label in dict.fromkeys(label_of(r) for r in rows):
        mine = [r for r in rows if label_of(r) == label]
        ax.plot([r["num_turns"] for r in mine], [r["wall_s"] for r in mine], "o-", label=label or None)
    for r in rows:
        if label_of(r) == label_of(rows[0]):
            ax.annotate(f"{r['agents']} agents", (r["num_turns"], r["wall_s"]), fontsize=8)
    ax.set_xlabel("simulated turns")
    ax.set_ylabel("wall time (s)")
    ax.set_title(title, fontsize=9)
    if label_of(rows[0]):
        ax.legend(fontsize=8)
    fig.tight_layout()
    Path(plot).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(plot, dpi=120)
    plt.close(fig)


BUILDS = ("pure", "compiled")
# what a child runs: the benchmark of the code on its PYTHONPATH, one agent count, its rows as JSON
_CHILD = ("import json, sys; from dualpath._build import build_kind; "
          "from dualpath.bench.sim_speed import run_speed_bench; from dualpath.experiments.simrun import code_fingerprint; "
          "a = json.loads(sys.argv[1]); rows = run_speed_bench(*a, None, None); "
          "print(json.dumps({'rows': rows, 'build': build_kind(), 'simulator_code': code_fingerprint()}))")


@dataclass(frozen=True)
class Variant:
    label: str  # "pure", "compiled", or the other checkout's folder name
    src: Path  # the src/ folder whose `dualpath` it imports
    build: str | None  # "pure" | "compiled"; None: whichever the other checkout runs (older code may not choose)


def variants(builds: list[str], src: Path, against: Path | None) -> list[Variant]:
    for b in builds:
        if b not in BUILDS:
            raise InputError(f"--builds: unknown build {b!r} (pure, compiled)")
    out = [Variant(b, src, b) for b in builds]
    if against is not None:
        if not (against / "dualpath" / "__init__.py").is_file():
            raise InputError(f"--against {against}: not a src/ folder holding a dualpath package")
        out.append(Variant(against.parent.name if against.name == "src" else against.name, against, None))
    return out


def _run_child(v: Variant, args: list[Any]) -> dict[str, Any]:
    env = {k: x for k, x in os.environ.items() if k != "DUALPATH_BUILD"}
    env["PYTHONPATH"] = str(v.src)
    if v.build is not None:
        env["DUALPATH_BUILD"] = v.build
    child = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(args)], env=env, capture_output=True, text=True)
    if child.returncode != 0:
        raise RuntimeError(f"sim-speed {v.label}: {child.stderr.strip().splitlines()[-1:]}")
    got = json.loads(child.stdout.strip().splitlines()[-1])
    if v.build is not None and got["build"] != v.build:
        raise InputError(f"sim-speed {v.label}: {v.src} has no fresh compiled build (`make compiled` there)")
    return got


def side_by_side(model: str, pd: str, max_len: str, counts: list[int], mode: str, seed: int, vs: list[Variant],
                 json_path: Path | None, plot: Path | None) -> dict[str, Any]:
    """Every variant at every agent count, variants interleaved; rows carry their variant's label."""
    rows: list[dict[str, Any]] = []
    code: dict[str, str] = {}
    built: dict[str, str] = {}
    for n in counts:
        for v in vs:
            got = _run_child(v, [model, pd, max_len, [n], mode, seed])
            code[v.label], built[v.label] = got["simulator_code"], got["build"]
            rows += [{**r, "variant": v.label} for r in got["rows"]]
    result = {"model": model, "pd": pd, "max_len": max_len, "mode": mode, "seed": seed,
              "variants": [{"label": v.label, "build": built[v.label], "simulator_code": code[v.label],
                            "src": "this tree" if v.src == vs[0].src else str(v.src)} for v in vs],
              "rows": rows}
    if json_path:
        write_json(result, json_path)
    if plot:
        _plot(rows, plot, f"simulator speed ({model} {pd} {max_len} {mode})", lambda r: r["variant"])
    return result
