"""Replay agentic trajectories (or a Mooncake trace) against a router, the paper's way.

Trajectories (docs/paper.md §4.2): round i sends the whole context (every earlier append and generated
token) plus A_i new tokens and asks for exactly g_i tokens (min_tokens = max_tokens, EOS
ignored), after the round's tool time (`TurnSpec.wait_s`, counted from the previous answer). Token ids are synthetic: each agent's appends are seeded random ids from the ordinary
part of the vocabulary, so agents never share a prefix while each agent's turns do.

Mooncake traces: each block id (512 tokens, or fewer in a `rescale`d trace) becomes as many fixed
random ids (seeded by the id), so requests that share block ids share prefixes and hit the store,
as in production; requests are sent at their timestamps (scaled) and generate `output_length`
tokens. `TraceWorkload` carries a trace's records and time scale where a list of trajectories
would go (`replay_workload`).

Both return per-turn timestamps and a summary with the simulator's JSON keys.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from ...metrics import turn_latencies
from ..api import GenerationRequest, SamplingParams
from ..clock import Clock
from ..router.router import Router


@dataclass(frozen=True, slots=True)
class TraceWorkload:
    """Mooncake records replayed open loop: record i arrives at (timestamp_i - first) * time_scale s."""

    records: tuple[Any, ...]  # workloads.mooncake.MooncakeRecord
    time_scale: float

    @property
    def num_turns(self) -> int:
        return len(self.records)


def num_turns(workload: Sequence[Any] | TraceWorkload) -> int:
    if isinstance(workload, TraceWorkload):
        return workload.num_turns
    return sum(len(t.turns) for t in workload)


@dataclass(slots=True)
class TurnRecord:
    agent: int
    turn: int
    arrival_s: float
    first_s: float
    second_s: float
    finish_s: float
    prompt_tokens: int
    cached_tokens: int
    gen_tokens: int
    output: tuple[int, ...] = ()  # the generated token ids


def _ordinary_ids(vocab_size: int, reserved: int = 16) -> tuple[int, int]:
    """Ids to draw synthetic text from: skip the first few (special tokens sit there in SmolLM2)."""
    return (reserved, vocab_size) if vocab_size > 4 * reserved else (0, vocab_size)


async def _one_request(router: Router, clock: Clock, name: str, prompt: list[int], gen: int, agent: int, turn: int,
                       records: list[TurnRecord]) -> list[int]:
    params = SamplingParams(max_tokens=gen, temperature=0.0, min_tokens=gen, ignore_eos=True)
    t0 = clock.now_s()
    times: list[float] = []
    out: list[int] = []
    cached = 0
    async for ev in router.generate(GenerationRequest(name, tuple(prompt), params)):
        times.append(clock.now_s())
        out.append(ev.token_id)
        cached = ev.cached_tokens
    second = times[1] if len(times) > 1 else times[0]
    records.append(TurnRecord(agent, turn, t0, times[0], second, times[-1], len(prompt), cached, len(out), tuple(out)))
    return out


async def _send_in_order(arrivals_s: Sequence[float], clock: Clock, launch: Callable[[int], Any]) -> None:
    """Start `launch(i)` at each arrival (seconds from now) in (arrival, i) order and wait for all:
    requests that arrive together are sent in workload order (as the simulator admits them), not in
    whichever order their timers happen to fire."""
    start = clock.now_s()
    tasks = []
    for i in sorted(range(len(arrivals_s)), key=lambda k: (arrivals_s[k], k)):
        delay_s = start + arrivals_s[i] - clock.now_s()
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        tasks.append(asyncio.create_task(launch(i)))
    await asyncio.gather(*tasks)


async def replay_trajectories(router: Router, trajectories: Sequence[Any], arrivals_s: Sequence[float], vocab_size: int,
                              clock: Clock, seed: int = 0, on_turn: Callable[[int], None] | None = None,
                              cold: bool = False) -> list[TurnRecord]:
    """`cold`: every turn is a fresh prompt (nothing earlier is resent, so nothing hits the store)."""
    lo, hi = _ordinary_ids(vocab_size)
    records: list[TurnRecord] = []

    async def agent(k: int) -> None:
        rng = np.random.default_rng((seed, k))
        context: list[int] = []
        for i, t in enumerate(trajectories[k].turns):
            if t.wait_s > 0.0:  # the agent's tool time since its last answer
                await asyncio.sleep(t.wait_s)
            prompt = context + rng.integers(lo, hi, size=t.append_tokens).tolist()
            out = await _one_request(router, clock, f"a{k}t{i}", prompt, t.gen_tokens, k, i, records)
            context = [] if cold else prompt + out
            if on_turn is not None:
                on_turn(len(records))

    await _send_in_order(arrivals_s, clock, agent)
    return records


async def replay_mooncake(router: Router, records_in: Sequence[Any], vocab_size: int, clock: Clock, time_scale: float = 1.0,
                          on_turn: Callable[[int], None] | None = None) -> list[TurnRecord]:
    """Each trace block id stands for `block_tokens` fixed tokens (seeded by the id), so equal ids
    give equal prefixes; request i is a one-turn agent, named `a<i>t0` as the simulator names it."""
    lo, hi = _ordinary_ids(vocab_size)
    cache: dict[int, list[int]] = {}

    def block(bid: int, block_tokens: int) -> list[int]:
        if bid not in cache:
            cache[bid] = np.random.default_rng(bid).integers(lo, hi, size=block_tokens).tolist()
        return cache[bid]

    records: list[TurnRecord] = []
    t_first = min(r.timestamp_s for r in records_in) if records_in else 0.0

    async def one(i: int) -> None:
        rec = records_in[i]
        prompt = [t for bid in rec.block_ids for t in block(bid, rec.block_tokens)][: rec.input_tokens]
        await _one_request(router, clock, f"a{i}t0", prompt, max(1, rec.output_tokens), i, 0, records)
        if on_turn is not None:
            on_turn(len(records))

    await _send_in_order([(r.timestamp_s - t_first) * time_scale for r in records_in], clock, one)
    return records


async def replay_workload(router: Router, workload: Sequence[Any] | TraceWorkload, vocab_size: int, clock: Clock,
                          seed: int = 0, on_turn: Callable[[int], None] | None = None,
                          cold: bool = False) -> list[TurnRecord]:
    """Trajectories (all arriving at t = 0) or a `TraceWorkload`."""
    if isinstance(workload, TraceWorkload):
        return await replay_mooncake(router, workload.records, vocab_size, clock, workload.time_scale, on_turn)
    return await replay_trajectories(router, workload, [0.0] * len(workload), vocab_size, clock, seed, on_turn, cold)


def storage_read_bytes(router: Router) -> dict[str, int]:
    """Storage (SNIC) bytes read so far in this mode, per node ("PE0", "DE1": one engine per
    node), as the engines last reported them (every ~0.5 s); for progress lines."""
    roles = {e: ("PE" if st.role == "prefill" else "DE") for e, st in router.engines.items()}
    return {f"{roles.get(e, 'E')}{e}": c.storage_read_bytes for e, c in sorted(router.metrics.engine_counters.items())}


def summarise(records: list[TurnRecord], router_summary: dict, wall_s: float, num_agents: int) -> dict:
    """The simulator's run keys, measured on the real cluster."""
    arrival = np.array([r.arrival_s for r in records])
    first = np.array([r.first_s for r in records])
    second = np.array([r.second_s for r in records])
    finish = np.array([r.finish_s for r in records])
    gen = np.array([r.gen_tokens for r in records])
    t0 = arrival.min() if len(arrival) else 0.0
    return {
        "jct_s": float(finish.max() - t0) if len(finish) else float("nan"),
        **turn_latencies(arrival, first, second, finish, gen),
        "bytes": router_summary["bytes"],
        "cached_tokens": int(sum(r.cached_tokens for r in records)),
        "prompt_tokens": int(sum(r.prompt_tokens for r in records)),
        "num_turns": len(records),
        "num_agents": num_agents,
        "wall_s": wall_s,
        "tokens_sha256": tokens_sha256(records),
    }


def tokens_sha256(records: list[TurnRecord]) -> str:
    """One digest of every turn's generated tokens, by (agent, turn): equal digests, equal outputs
    (greedy decoding: the same whichever mode, read path or host layout served them)."""
    import hashlib

    h = hashlib.sha256()
    for r in sorted(records, key=lambda r: (r.agent, r.turn)):
        h.update(f"{r.agent}:{r.turn}:{','.join(map(str, r.output))};".encode())
    return h.hexdigest()
