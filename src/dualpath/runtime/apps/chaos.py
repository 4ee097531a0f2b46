"""`dualpath chaos`: the engine-fault matrix on a local cluster, against a fault-free reference.

Every scenario runs the same greedy workload on a fresh 2P2D cluster (two engines per role, so that
policy `recompute` has a survivor to migrate to):
  1. turn 1: `num_requests` prompts of whole blocks; their KV is persisted (the store is warm);
  2. turn 2: each prompt again plus its answer plus new tokens, all at once, so that every request
     reads its hit (on the PE or the DE side) before it prefills and then decodes;
  3. during turn 2 the fault: when the scenario's moment comes (a request of turn 2 reading its hit,
     prefilling, or decoding), the engine holding that request gets the signal (SIGKILL, SIGTERM or
     SIGSTOP: a frozen engine, found by heartbeats within RuntimeConfig.engine_heartbeat_timeout_s,
     runtime/router/liveness.py).
Each request of turn 2 ends finished (its tokens compared with the reference run's, which had no
fault) or with the error the client sees (`ServiceUnavailable`: no survivor, retries spent, or
policy `fail`); one still running `TERMINAL_BOUND_S` after the fault is counted lost. Recovery
seconds: from the signal to the last of the victim's requests reaching its terminal state.

Greedy decoding (temperature 0, EOS ignored) makes the reference exact: the same request gives
the same tokens whichever engine, read path or attempt served it (runtime/router/recovery.py
migrates a request with the tokens streamed so far).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

from ...config import RuntimeConfig
from ...core.phase import Phase
from ...core.snapshot import ReadSide
from ...errors import InputError
from ..api import GenerationRequest, SamplingParams, ServiceUnavailable
from ..cluster import LocalCluster

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}
# (victim role, moment): the phase of a turn-2 request on the victim that triggers the signal
MOMENTS = {
    ("pe", "read"): {Phase.READING},  # its hit is being read (PE side: the PE's own read)
    ("pe", "prefill"): {Phase.PREFILL_READY, Phase.PREFILLING},  # in the PE's batch or forward
    ("de", "read"): {Phase.READING},  # DE side: the DE reads, then streams layers to the PE
    ("de", "decode"): {Phase.DECODING},
}
SCENARIOS = tuple(f"{role}-{sig}-{moment}" for (role, moment) in MOMENTS for sig in SIGNALS)
# A request not terminal this long after the fault is lost: 6x the default heartbeat timeout
# (RuntimeConfig.engine_heartbeat_timeout_s, 5 s), within which a frozen engine is fenced.
TERMINAL_BOUND_S = 30.0
APPEND_TOKENS = 64  # turn 2's new tokens: one block
PROMPT_BLOCKS = 3  # turn 1's prompt: 3 blocks of 64 tokens


@dataclass(frozen=True, slots=True)
class ChaosResult:
    scenario: str
    requests: int
    finished: int
    errored: int
    lost: int
    wrong_tokens: int
    recovery_s: float  # signal -> the victim's last request terminal (nan: the moment never came)
    victim: int  # engine id (-1: none)
    fired: bool

    def to_json(self) -> dict:
        return asdict(self)


def parse_scenarios(names: list[str] | None) -> list[str]:
    if not names or names == ["all"]:
        return list(SCENARIOS)
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        raise InputError(f"unknown scenario {bad[0]!r}; choose all or one of: {', '.join(SCENARIOS)}")
    return names


def chaos_config(model: str, policy: str, mode: str = "dualpath", **overrides: Any) -> RuntimeConfig:
    return RuntimeConfig(model=model, num_prefill=2, num_decode=2, mode=mode, engine_fault_policy=policy,
                         host_buffer_bytes=32 * 2**20,
                         pe_hbm_bytes=32 * 2**20, de_kv_tokens=8192, **overrides)


def _prompts(num: int, vocab: int) -> list[list[int]]:
    n = PROMPT_BLOCKS * 64
    return [[(17 + 31 * i + 7 * j) % (vocab - 32) + 16 for j in range(n)] for i in range(num)]


async def _greedy(router: Any, name: str, prompt: list[int], gen_tokens: int) -> list[int] | None:
    """The request's tokens, or None when it ended with an error the client sees."""
    params = SamplingParams(max_tokens=gen_tokens, temperature=0.0, ignore_eos=True, min_tokens=gen_tokens)
    out: list[int] = []
    try:
        async for ev in router.generate(GenerationRequest(name, prompt, params)):
            out.append(ev.token_id)
    except ServiceUnavailable:
        return None
    return out


async def _two_turns(cluster: LocalCluster, num: int, gen_tokens: int,
                     fault: Callable[[Any, list[asyncio.Task]], Any] | None) -> tuple[list, Any]:
    router = cluster.router
    vocab = router.tokenizer.vocab_size
    first = _prompts(num, vocab)
    turn1 = await asyncio.gather(*(_greedy(router, f"c{i}t0", p, gen_tokens) for i, p in enumerate(first)))
    if any(t is None for t in turn1):
        raise RuntimeError("turn 1 failed before any fault")
    await asyncio.sleep(0.5)  # the last blocks persist
    second = [p + t + [(5 + i + j) % (vocab - 32) + 16 for j in range(APPEND_TOKENS)]
              for i, (p, t) in enumerate(zip(first, turn1))]
    tasks = [asyncio.create_task(_greedy(router, f"c{i}t1", p, gen_tokens)) for i, p in enumerate(second)]
    info = await fault(router, tasks) if fault is not None else None
    done, pending = await asyncio.wait(tasks, timeout=TERMINAL_BOUND_S)
    for t in pending:
        t.cancel()
    return [t.result() if t in done else "lost" for t in tasks], info


def _client_name(rr: Any) -> str:
    return (rr.origin or rr.req).request_id  # a migrated attempt answers for the client's request


def _fault(cluster: LocalCluster, scenario: str) -> Callable[[Any, list[asyncio.Task]], Any]:
    """Wait for the scenario's moment, signal the engine holding that request; return the victim,
    the time, and the client tasks whose requests were on the victim then."""
    role, sig, moment = scenario.split("-")
    phases = MOMENTS[(role, moment)]

    def target(rr: Any) -> Any:
        if rr.finished or rr.phase not in phases or not _client_name(rr).endswith("t1"):
            return None
        if moment == "read" and (rr.side is ReadSide.DECODE) != (role == "de"):
            return None  # a read on the other side: not this scenario's
        return rr.pe if role == "pe" else rr.de

    async def fire(router: Any, tasks: list[asyncio.Task]) -> dict:
        deadline = time.monotonic() + TERMINAL_BOUND_S
        while time.monotonic() < deadline and not all(t.done() for t in tasks):
            for rr in list(router.requests.values()):
                eng = target(rr)
                if eng is None:
                    continue
                on_victim = {_client_name(r) for r in router.requests.values()
                             if not r.finished and eng in (r.pe, r.de)}
                os.kill(cluster.processes[eng.engine].pid, SIGNALS[sig])
                victims = [t for i, t in enumerate(tasks) if f"c{i}t1" in on_victim]
                return {"victim": eng.engine, "t_s": time.monotonic(), "tasks": victims}
            await asyncio.sleep(0.001)
        return {"victim": -1, "t_s": time.monotonic(), "tasks": []}

    return fire


async def run_scenario(cfg: RuntimeConfig, scenario: str, reference: list[list[int]], gen_tokens: int) -> ChaosResult:
    async with LocalCluster(cfg) as cluster:
        fault = _fault(cluster, scenario)
        info: dict = {}

        async def fire_and_time(router: Any, tasks: list[asyncio.Task]) -> dict:
            got = await fault(router, tasks)
            info.update(got)
            if got["tasks"]:
                await asyncio.wait(got["tasks"], timeout=TERMINAL_BOUND_S)
                info["recovery_s"] = time.monotonic() - got["t_s"]
            return got

        outcomes, _ = await _two_turns(cluster, len(reference), gen_tokens, fire_and_time)
        if info.get("victim", -1) >= 0 and SIGNALS[scenario.split("-")[1]] == signal.SIGSTOP:
            try:  # the router fences a frozen engine by killing it; if it has not yet, let it go
                os.kill(cluster.processes[info["victim"]].pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    finished = [o for o in outcomes if isinstance(o, list)]
    return ChaosResult(
        scenario, len(outcomes), len(finished), sum(1 for o in outcomes if o is None),
        sum(1 for o in outcomes if o == "lost"),
        sum(1 for o, ref in zip(outcomes, reference) if isinstance(o, list) and o != ref),
        info.get("recovery_s", float("nan")), info.get("victim", -1), info.get("victim", -1) >= 0)


async def run_chaos(scenarios: list[str], model: str = "tiny", policy: str = "recompute", num_requests: int = 4,
                    gen_tokens: int = 48, on_result: Callable[[ChaosResult], None] | None = None) -> dict:
    """The reference (no fault) once, then every scenario on a fresh cluster."""
    cfg = chaos_config(model, policy)
    async with LocalCluster(cfg) as cluster:
        reference, _ = await _two_turns(cluster, num_requests, gen_tokens, None)
    if any(not isinstance(r, list) for r in reference):
        raise RuntimeError("the fault-free reference run did not finish every request")
    results = []
    for name in scenarios:
        res = await run_scenario(replace(cfg), name, reference, gen_tokens)
        results.append(res)
        if on_result is not None:
            on_result(res)
    return {"config": {"model": model, "policy": policy, "num_requests": num_requests, "gen_tokens": gen_tokens,
                       "pd": "2P2D", "heartbeat_timeout_s": cfg.engine_heartbeat_timeout_s,
                       "terminal_bound_s": TERMINAL_BOUND_S},
            "results": [r.to_json() for r in results]}
