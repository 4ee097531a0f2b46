"""What the planner plans for, as two strategies chosen once from the flags:

- `Generated`: the Table-2-calibrated generator's agents (offline, or Poisson arrivals with
  `--aps`); a shape is simulated at its unit (space.py), the agents and arrival rate divided by
  the copies, through the experiments' cached simulations (`SimSpec`).
- `Trace`: a Mooncake trace's requests at their (scaled) timestamps, as `dualpath sim --trace`
  replays them; a trace has one load, so every shape is simulated whole.

Both give the analytic model the same rows (one per turn: agent, prompt, hit, generated tokens)
and the last arrival, and the planner the same results (sim/results.py keys) and command lines."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..config import SimConfig, WorkloadConfig, paper_cluster
from ..core.request import usable_hit_tokens
from ..errors import InputError
from ..experiments.batch import simulate_many
from ..experiments.common import Context
from ..experiments.simrun import SimSpec
from ..sim.bound import RunBound
from ..parsing import format_tokens
from .space import Shape

Row = tuple[int, int, int, int, float]  # (agent, prompt tokens, hit tokens, generated tokens, tool time before it s)


@dataclass(frozen=True, slots=True)
class Generated:
    max_len_tokens: int
    num_agents: int
    seed: int
    aps: float | None = None
    tool_time_s: float = 0.0  # median tool time between an agent's rounds (workloads/tool_time.py)

    def rows(self, block_tokens: int) -> tuple[list[Row], float]:
        from ..workloads import generate, poisson_arrivals
        from ..workloads.tool_time import with_tool_times

        trajs = with_tool_times(generate(self.max_len_tokens, self.num_agents, self.seed), self.tool_time_s, 1.0, self.seed)
        rows = [(a, t.input_tokens(i), usable_hit_tokens(t.context_tokens(i), t.input_tokens(i), block_tokens),
                 turn.gen_tokens, turn.wait_s) for a, t in enumerate(trajs) for i, turn in enumerate(t.turns)]
        last = 0.0 if self.aps is None else max(poisson_arrivals(self.num_agents, self.aps, self.seed))
        return rows, last

    def shape_for(self, shape: Shape) -> Shape:
        return shape

    @property
    def online(self) -> bool:
        return self.aps is not None

    def at_load(self, load: float) -> Generated:
        """The same agents arriving `load` times as fast (online only)."""
        return self if load == 1.0 or self.aps is None else replace(self, aps=self.aps * load)

    def simulate(self, ctx: Context, model: str, configs: Sequence[tuple[Shape, str, float]],
                 bound: RunBound | None = None) -> list[dict[str, Any]]:
        """One batch: each (shape, mode, load) at its unit, stopped at `bound` (sim/bound.py)."""
        return simulate_many(ctx, [replace(self.at_load(f).unit_spec(model, s, m), bound=bound) for s, m, f in configs])

    def unit_spec(self, model: str, shape: Shape, mode: str) -> SimSpec:
        k = shape.copies
        aps = None if self.aps is None else self.aps / k
        return SimSpec(model, shape.unit_pd, self.max_len_tokens, self.num_agents // k, mode, aps=aps,
                       knobs=shape.ep_knobs() + _unit_of(k), tool_time_s=self.tool_time_s)

    def whole_spec(self, model: str, shape: Shape, mode: str) -> SimSpec:
        """The whole deployment (k units, each its own EP groups), as `dualpath bench plan` checks it."""
        return SimSpec(model, shape.pd, self.max_len_tokens, self.num_agents, mode, aps=self.aps, knobs=shape.ep_knobs(),
                       tool_time_s=self.tool_time_s)

    def sim_flags(self, shape: Shape, unit: bool) -> str:
        k = shape.copies if unit else 1
        aps = "" if self.aps is None else f" --aps {self.aps / k:g}"
        aps += f" --tool-time {self.tool_time_s:g}" if self.tool_time_s else ""
        knobs = "".join(f" --set {a}" for a in shape.ep_knobs() + (_unit_of(k) if unit else ()))
        return (f"--agents {self.num_agents // k} --max-len {format_tokens(self.max_len_tokens)} --seed {self.seed}"
                f"{aps}{knobs}")

    def describe(self) -> dict[str, Any]:
        return {"kind": "generated", "max_len_tokens": self.max_len_tokens, "agents": self.num_agents,
                "seed": self.seed, "aps": self.aps, "tool_time_s": self.tool_time_s}


@dataclass(frozen=True, slots=True)
class Trace:
    path: str
    max_len_tokens: int
    time_scale: float = 1.0
    limit: int | None = None

    def records(self) -> list:
        from ..workloads import read_mooncake

        recs = [r for r in read_mooncake(self.path) if r.input_tokens + r.output_tokens <= self.max_len_tokens]
        recs = recs[: self.limit]
        if not recs:
            raise InputError(f"{self.path}: no request fits --max-len {self.max_len_tokens} (input + output tokens)")
        return recs

    def rows(self, block_tokens: int) -> tuple[list[Row], float]:
        """Each request's hit: the longest prefix of its blocks that an earlier request wrote (the
        store keeps everything: an estimate of reuse, as `trace stats` counts it); its agent: the
        conversation it continues."""
        from ..workloads.mooncake import Rechunker, infer_parents
        from ..workloads.stats import seen_prefix_blocks

        recs = sorted(self.records(), key=lambda r: r.timestamp_s)
        parents = infer_parents(recs)
        rechunker = Rechunker(block_tokens, recs[0].block_tokens)
        seen: set[int] = set()
        rows: list[Row] = []
        root = list(range(len(recs)))
        for i, (rec, p) in enumerate(zip(recs, parents)):
            root[i] = i if p is None else root[p]
            ids = rechunker.rechunk(rec)
            num_hit = seen_prefix_blocks(ids, seen)
            seen.update(ids)
            hit = usable_hit_tokens(num_hit * block_tokens, rec.input_tokens, block_tokens)
            rows.append((root[i], rec.input_tokens, hit, max(1, rec.output_tokens), 0.0))
        last = (recs[-1].timestamp_s - recs[0].timestamp_s) * self.time_scale
        return rows, last

    def shape_for(self, shape: Shape) -> Shape:
        return Shape(shape.num_prefill_nodes, shape.num_decode_nodes, shape.num_prefill_nodes, shape.num_decode_nodes)

    @property
    def online(self) -> bool:
        return True

    def at_load(self, load: float) -> Trace:
        """The same requests, their timestamps divided by `load`."""
        return self if load == 1.0 else replace(self, time_scale=self.time_scale / load)

    def simulate(self, ctx: Context, model: str, configs: Sequence[tuple[Shape, str, float]],
                 bound: RunBound | None = None) -> list[dict[str, Any]]:
        """One batch: each (shape, mode, load) whole, as `dualpath sim --trace` runs it, stopped at
        `bound` (sim/bound.py)."""
        from ..sim.runner import TraceReplay, run_mode

        args = []
        for shape, mode, load in configs:
            cfg = SimConfig(cluster=paper_cluster(model, shape.pd),
                            workload=WorkloadConfig(max_len_tokens=self.max_len_tokens, trajectory_file=self.path))
            args.append((cfg, mode, TraceReplay(self.at_load(load).time_scale, self.limit), True, bound))
        results: list[Any] = [None] * len(args)

        def landed(i: int, result: dict[str, Any]) -> None:
            results[i] = result
            shape, mode, load = configs[i]
            ctx.progress.sim_finished(f"{shape.pd} {mode} load x{load:.3g}", result["wall_s"], i + 1, len(args))

        ctx.executor.map(run_mode, args, landed)
        return results

    def sim_flags(self, shape: Shape, unit: bool) -> str:
        limit = "" if self.limit is None else f" --limit {self.limit}"
        return (f"--trace {self.path} --max-len {format_tokens(self.max_len_tokens)} "
                f"--time-scale {self.time_scale:g}{limit}")

    def describe(self) -> dict[str, Any]:
        return {"kind": "trace", "path": self.path, "max_len_tokens": self.max_len_tokens,
                "time_scale": self.time_scale, "limit": self.limit}


def _unit_of(k: int) -> tuple[str, ...]:
    """The `--set` that makes a unit's agents one unit's share of the deployment's (workloads/sample.py)."""
    return (f"workload.unit_of={k}",) if k > 1 else ()
