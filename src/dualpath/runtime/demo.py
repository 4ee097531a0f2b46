"""`dualpath demo`: a local 1P1D cluster on the embedded defaults, an agentic replay in `basic`
then `dualpath` mode, with SNIC caps that make loading dominate.

Workload: 4 agents x 15 rounds; a first prompt of 574 tokens, then 61 appended tokens and
exactly 3 generated tokens per round (zero tool and think time, as the paper's replay; 3 tokens so
TPOT, which excludes the first two, is defined). The sizes are block aligned: after each round
the KV of prompt + 2 generated tokens fills whole 64-token blocks, so every later round hits its
entire context and computes only 62 new tokens, as an agentic turn does (~99% hits); the CPU's
time then goes to loading, which is what the demo shows. KV is float32: 46 KB per token for
SmolLM2-135M, so each round reloads 26-53 MB per agent.

SNIC cap: 30 MB/s per node and direction, the same on both nodes. The CNIC of each (one-engine)
node runs at 8x that: a node's eight 400 Gbps CNICs against one 400 Gbps SNIC (PAPER.md 1.2), so
the compute network is not the bottleneck, as in the paper.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any, Callable

from ..config import DEMO_AGENTS, DEMO_ROUNDS, DEMO_SNIC_BYTES_PER_S, RuntimeConfig
from ..core.request import TurnSpec
from ..workloads import Trajectory
from .clock import MonotonicClock
from .cluster import LocalCluster
from .replay import replay_trajectories, summarise

CNIC_PER_SNIC = 8  # PAPER.md 1.2: 8 x 400 Gbps CNIC per node, 1 x 400 Gbps SNIC


def demo_workload(num_agents: int = DEMO_AGENTS, rounds: int = DEMO_ROUNDS, first_prompt_tokens: int = 574, append_tokens: int = 61,
                  gen_tokens: int = 3) -> list[Trajectory]:
    turns = (TurnSpec(first_prompt_tokens, gen_tokens),) + (TurnSpec(append_tokens, gen_tokens),) * (rounds - 1)
    return [Trajectory(a, turns) for a in range(num_agents)]


def demo_config(mode: str, snic_bytes_per_s: float | None = DEMO_SNIC_BYTES_PER_S, model: str = "smollm2-135m") -> RuntimeConfig:
    cnic = None if snic_bytes_per_s is None else CNIC_PER_SNIC * snic_bytes_per_s
    return RuntimeConfig(model=model, mode=mode, snic_bytes_per_s=snic_bytes_per_s, cnic_bytes_per_s=cnic,
                         host_buffer_bytes=256 * 2**20, pe_hbm_bytes=128 * 2**20, de_kv_tokens=32768)


async def run_workload(cluster: LocalCluster, trajectories: list[Trajectory],
                       on_turn: Callable[[int], None] | None = None) -> dict[str, Any]:
    cfg = cluster.cfg
    clock = MonotonicClock()
    router = cluster.router
    vocab = router.tokenizer.vocab_size
    t0 = time.perf_counter()
    records = await replay_trajectories(router, trajectories, [0.0] * len(trajectories), vocab, clock, cfg.seed, on_turn)
    wall = time.perf_counter() - t0
    await asyncio.sleep(1.0)  # a last round of engine counters
    router.check_invariants()
    router = cluster.router
    counters = dict(router.metrics.engine_counters)
    result = summarise(records, router.metrics.summary(), wall, len(trajectories))
    rate = cfg.snic_bytes_per_s
    result["mode"] = cfg.mode
    result["snic"] = {
        str(e): {"read_bytes": c.storage_read_bytes, "write_bytes": c.storage_write_bytes,
                 "utilisation": (c.storage_read_bytes / (rate * result["jct_s"])) if rate else None,
                 "utilisation_while_reading": (c.storage_read_bytes / (rate * c.read_busy_s)) if rate and c.read_busy_s else None}
        for e, c in sorted(counters.items())
    }
    result["engine_busy_s"] = {str(e): c.busy_s for e, c in sorted(counters.items())}
    return result


async def run_demo(modes: tuple[str, ...] = ("basic", "dualpath"), snic_bytes_per_s: float | None = DEMO_SNIC_BYTES_PER_S,
                   model: str = "smollm2-135m", seed: int = 0, on_turn: Callable[[str, int, int], None] | None = None,
                   num_agents: int = DEMO_AGENTS, rounds: int = DEMO_ROUNDS, device: str = "cpu") -> dict:
    """One cluster runs every mode in turn, each on a fresh, empty store (no restart between)."""
    trajectories = demo_workload(num_agents, rounds)
    total = sum(len(t.turns) for t in trajectories)
    runs = []
    t0 = time.perf_counter()
    async with LocalCluster(replace(demo_config(modes[0], snic_bytes_per_s, model), seed=seed, device=device)) as cluster:
        startup_s = time.perf_counter() - t0
        for i, mode in enumerate(modes):
            if i:
                await cluster.switch_mode(mode)
            cb = None if on_turn is None else (lambda n, m=mode: on_turn(m, n, total))
            runs.append(await run_workload(cluster, trajectories, cb))
    return {
        "config": {"model": model, "pd": "1P1D", "snic_bytes_per_s": snic_bytes_per_s,
                   "cnic_bytes_per_s": None if snic_bytes_per_s is None else CNIC_PER_SNIC * snic_bytes_per_s,
                   "kv_dtype": "float32", "seed": seed, "device": device},
        "workload": {"num_agents": len(trajectories), "num_turns": total, "rounds": len(trajectories[0].turns),
                     "first_prompt_tokens": trajectories[0].turns[0].append_tokens,
                     "append_tokens": trajectories[0].turns[1].append_tokens, "gen_tokens": trajectories[0].turns[1].gen_tokens},
        "startup_s": startup_s,
        "runs": runs,
    }
