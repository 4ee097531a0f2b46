"""`dualpath chaos`: the fault matrix on a local cluster, against a fault-free reference (across
emulated hosts with `--testbed`: chaos/testbed.py plays the same scenarios through `play_scenario`).

Every scenario runs the same greedy workload on a fresh 2P2D cluster (two engines per role, so that
policy `recompute` has a survivor to migrate to):
  1. turn 1: `num_requests` prompts of whole blocks; their KV is persisted (the store is warm);
  2. turn 2: each prompt again plus its answer plus new tokens, all at once, so that every request
     reads its hit (on the PE or the DE side) before it prefills and then decodes;
  3. during turn 2 the fault: when the scenario's moment comes (MOMENTS: a request of turn 2
     reading its hit, streaming its layers from a DE, prefilling, in its PD transfer, decoding, or
     a DE persisting its blocks), the victim gets the signal (SIGKILL, SIGTERM or SIGSTOP): the
     engine holding that request (a frozen one is found by heartbeats within
     RuntimeConfig.faults.heartbeat_timeout_s, runtime/router/liveness.py), or the storage
     service the cluster runs against in `store-*` scenarios (chaos/store_victim.py: failed reads are
     misses, failed persists are skipped, a frozen service costs each client one
     RuntimeConfig.store.timeout_s, then its breaker skips calls). A frozen victim gets SIGCONT at
     the end. A moment that never comes is reported `fired: false`.
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
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Mapping

from ..config import EngineConfig, FaultConfig, RuntimeConfig
from ..config.overrides import apply_overrides, set_fields
from ..core.phase import Phase
from ..core.snapshot import ReadSide
from ..errors import InputError
from ..runtime.api import GenerationRequest, SamplingParams, ServiceUnavailable
from ..runtime.cluster import LocalCluster
from ..runtime.protocol import EngineRole
from ..runtime.store.breaker import STORE_RETRY_AFTER_S
from .store_victim import STORE_CALLS_ON_PATH, ServiceChild
from ..runtime.router.router import Router

SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM, "stop": signal.SIGSTOP}
_PREFILL = frozenset({Phase.PREFILL_READY, Phase.PREFILLING})
# (victim, moment): the phase of a turn-2 request on the victim that triggers the signal (None:
# no request phase marks it, see `_at_moment`)
MOMENTS = {
    ("pe", "read"): {Phase.READING},  # its hit is being read (PE side: the PE's own read)
    ("pe", "stream"): _PREFILL,  # a DE-side hit: its layers stream from the DE's buffer to this PE's forward
    ("pe", "prefill"): _PREFILL,  # in the PE's batch or forward (either read side)
    ("pe", "pd"): {Phase.KV_TO_DECODE},  # the last chunk computed, the PE->DE transfer in flight
    ("de", "read"): {Phase.READING},  # DE side: the DE reads, then streams layers to the PE
    ("de", "stream"): _PREFILL,  # the DE streams the read hit's layers to the PE's forward
    ("de", "pd"): {Phase.KV_TO_DECODE},  # the DE receives the prompt's KV and loads it
    ("de", "decode"): {Phase.DECODING},
    ("de", "persist"): None,  # the DE has a turn-2 block's write queued (PersistQueued .. Persisted)
    ("store", "read"): {Phase.READING},  # the storage service, while a turn-2 hit is to be read from it
    ("store", "persist"): None,  # the storage service, while a DE has a turn-2 block's write queued
}
SCENARIOS = tuple(f"{role}-{sig}-{moment}" for (role, moment) in MOMENTS for sig in SIGNALS)
# A request not terminal this long after the fault is lost: 6x the default heartbeat timeout
# (RuntimeConfig.faults.heartbeat_timeout_s, 5 s), within which a frozen engine is fenced; and 3x
# the store's bound (store_victim.STORE_CALLS_ON_PATH x RuntimeConfig.store.timeout_s, 5 s).
TERMINAL_BOUND_S = 30.0
STORE_VICTIM = -2  # ChaosResult.victim of a storage-service scenario
APPEND_TOKENS = 64  # turn 2's new tokens: one block
PROMPT_BLOCKS = 3  # turn 1's prompt: 3 blocks of 64 tokens
# Windows that last well under a millisecond for the tiny model (1 KiB of KV a token) made wide
# enough for the 1 ms poll to see: a 2 MB/s CNIC makes a turn-2 PD transfer (~300 KiB) take ~0.15 s,
# a DE-side layer stream (~200 KiB) ~0.1 s, a persisted block's D2H (64 KiB) ~30 ms; a 0.2 s store
# delay holds a turn-2 read before its first block. Timing only: greedy tokens do not change.
SLOW_CNIC_BYTES_PER_S = 2e6
STORE_READ_DELAY_S = 0.2
WIDENED = {"stream": {"links.cnic_bytes_per_s": SLOW_CNIC_BYTES_PER_S}, "pd": {"links.cnic_bytes_per_s": SLOW_CNIC_BYTES_PER_S},
           "persist": {"links.cnic_bytes_per_s": SLOW_CNIC_BYTES_PER_S}}
STORE_WIDENED = {"read": {"faults.store_read_delay_s": STORE_READ_DELAY_S}, "persist": WIDENED["persist"]}


@dataclass(frozen=True, slots=True)
class ChaosResult:
    scenario: str
    requests: int
    finished: int
    errored: int
    lost: int
    wrong_tokens: int
    recovery_s: float  # signal -> the victim's last request terminal (nan: the moment never came)
    victim: int  # engine id; STORE_VICTIM: the storage service; -1: none
    fired: bool
    # the router's store_faults() at the end (router/metrics.py): failed persists, calls skipped
    store_faults: dict = field(default_factory=dict)
    writes_pending: int = 0  # block writes queued on a live DE that had not ended TERMINAL_BOUND_S after turn 2

    def to_json(self) -> dict:
        return asdict(self)


def parse_scenarios(names: list[str] | None) -> list[str]:
    if not names or names == ["all"]:
        return list(SCENARIOS)
    bad = [n for n in names if n not in SCENARIOS]
    if bad:
        raise InputError(f"unknown scenario {bad[0]!r}; choose all or one of: {', '.join(SCENARIOS)}")
    return names


def chaos_config(model: str, policy: str, mode: str = "dualpath",
                 changes: Mapping[str, Any] | None = None) -> RuntimeConfig:
    """The chaos cluster, 2P2D; `changes`: {section.field: value} (config/overrides.py set_fields)."""
    cfg = RuntimeConfig(model=model, num_prefill=2, num_decode=2, mode=mode, faults=FaultConfig(policy=policy),
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=8192))
    return set_fields(cfg, changes or {})


def _prompts(num: int, vocab: int) -> list[list[int]]:
    n = PROMPT_BLOCKS * 64
    return [[(17 + 31 * i + 7 * j) % (vocab - 32) + 16 for j in range(n)] for i in range(num)]


async def _greedy(router: Router, name: str, prompt: list[int], gen_tokens: int) -> list[int] | None:
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


def _at_moment(router: Router, role: str, moment: str, baseline: set[bytes]) -> tuple[int, set[str]] | None:
    """(the victim: an engine id or STORE_VICTIM, the client requests it holds) once a turn-2
    request is at the scenario's moment; None before. `baseline`: writes queued before turn 2."""
    live = [r for r in router.requests.values() if not r.finished and _client_name(r).endswith("t1")]
    if moment == "persist":
        for e in router.membership.live_engines():
            if e.role is EngineRole.DECODE and router.placement.persisting_on(e.engine) - baseline:
                return (STORE_VICTIM, {_client_name(r) for r in live}) if role == "store" else (
                    e.engine, {_client_name(r) for r in live if e in (r.pe, r.de)})
        return None
    for rr in live:
        if rr.phase not in MOMENTS[(role, moment)]:
            continue
        if moment == "read" and role != "store" and (rr.side is ReadSide.DECODE) != (role == "de"):
            continue  # a read on the other side: not this scenario's
        if moment == "stream" and (rr.side is not ReadSide.DECODE or not rr.hit_tokens):
            continue  # no layers come from a DE's buffer
        if role == "store":
            return STORE_VICTIM, {_client_name(r) for r in live}
        eng = rr.pe if role == "pe" else rr.de
        return eng.engine, {_client_name(r) for r in live if eng in (r.pe, r.de)}
    return None


Signaller = Callable[[int, int], None]  # (victim: an engine id or STORE_VICTIM, signal number)


def local_signaller(cluster: LocalCluster, service: ServiceChild | None) -> Signaller:
    """Signals for a local cluster's engine processes and the storage service's child process."""

    def send(victim: int, sig: int) -> None:
        if victim == STORE_VICTIM:
            service.send(sig)
            return
        try:
            os.kill(cluster.processes[victim].pid, sig)
        except ProcessLookupError:
            pass  # already gone (fenced, or a kill before)

    return send


def _fault(send: Signaller, scenario: str) -> Callable[[Any, list[asyncio.Task]], Any]:
    """Wait for the scenario's moment, signal the victim (the engine holding that request, or the
    storage service); return the victim, the time, and the client tasks whose requests it held."""
    role, sig, moment = scenario.split("-")

    async def fire(router: Router, tasks: list[asyncio.Task]) -> dict:
        deadline = time.monotonic() + TERMINAL_BOUND_S
        baseline = set(router.placement.persisting)
        while time.monotonic() < deadline and not all(t.done() for t in tasks):
            hit = _at_moment(router, role, moment, baseline)
            if hit is not None:
                victim, held = hit
                send(victim, SIGNALS[sig])
                victims = [t for i, t in enumerate(tasks) if f"c{i}t1" in held]
                return {"victim": victim, "t_s": time.monotonic(), "tasks": victims}
            await asyncio.sleep(0.001)
        return {"victim": -1, "t_s": time.monotonic(), "tasks": []}

    return fire


def scenario_config(cfg: RuntimeConfig, scenario: str, kernel_rates: bool = False) -> RuntimeConfig:
    """The scenario's cluster: its moment's window widened (WIDENED, STORE_WIDENED); a stream
    scenario reads every hit on the DE side, so that layers stream from a DE's buffer.
    `kernel_rates`: the links' rates are the kernel's (the testbed, chaos/testbed.py), so no
    emulated rate is set here."""
    role, _, moment = scenario.split("-")
    extra = dict((STORE_WIDENED if role == "store" else WIDENED).get(moment, {}))
    if kernel_rates:
        extra.pop("links.cnic_bytes_per_s", None)
    if moment == "stream":
        extra["force_read_side"] = "decode"
    return set_fields(cfg, extra)


async def run_scenario(cfg: RuntimeConfig, scenario: str, reference: list[list[int]], gen_tokens: int) -> ChaosResult:
    service = ServiceChild() if scenario.startswith("store-") else None
    cfg = scenario_config(set_fields(cfg, {"store.location": service.url}) if service else cfg, scenario)
    try:
        async with LocalCluster(cfg) as cluster:
            return await play_scenario(cluster, local_signaller(cluster, service), scenario, reference, gen_tokens)
    finally:
        if service is not None:
            service.close()


async def play_scenario(cluster: LocalCluster, send: Signaller, scenario: str, reference: list[list[int]],
                        gen_tokens: int) -> ChaosResult:
    """The two turns on a started cluster, the fault at the scenario's moment; `send` signals
    the victim (local_signaller, or the testbed's processes: chaos/testbed.py)."""
    sig = scenario.split("-")[1]
    info: dict = {}
    fault = _fault(send, scenario)

    async def fire_and_time(router: Router, tasks: list[asyncio.Task]) -> dict:
        got = await fault(router, tasks)
        info.update(got)
        if got["tasks"]:
            await asyncio.wait(got["tasks"], timeout=TERMINAL_BOUND_S)
            info["recovery_s"] = time.monotonic() - got["t_s"]
        return got

    outcomes, _ = await _two_turns(cluster, len(reference), gen_tokens, fire_and_time)
    writes_pending = await _writes_ended(cluster.router)
    if info.get("victim", -1) != -1 and SIGNALS[sig] == signal.SIGSTOP:
        send(info["victim"], signal.SIGCONT)  # a frozen victim the router has not fenced goes on
    await asyncio.sleep(0.6)  # the engines' last Counters (every 0.5 s) carry their skipped calls
    store_faults = cluster.router.metrics.store_faults()
    finished = [o for o in outcomes if isinstance(o, list)]
    return ChaosResult(
        scenario, len(outcomes), len(finished), sum(1 for o in outcomes if o is None),
        sum(1 for o in outcomes if o == "lost"),
        sum(1 for o, ref in zip(outcomes, reference) if isinstance(o, list) and o != ref),
        info.get("recovery_s", float("nan")), info.get("victim", -1), info.get("victim", -1) != -1, store_faults,
        writes_pending)


async def _writes_ended(router: Router) -> int:
    """Wait (before a frozen victim is woken) until every queued block write has ended, stored or
    failed (a dead DE's are dropped: placement.engine_lost); how many had not within the bound."""
    deadline = time.monotonic() + TERMINAL_BOUND_S
    while router.placement.persisting and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return len(router.placement.persisting)


async def run_chaos(scenarios: list[str], model: str = "tiny", policy: str = "recompute", num_requests: int = 4,
                    gen_tokens: int = 48, on_result: Callable[[ChaosResult], None] | None = None,
                    overrides: list[str] | None = None) -> dict:
    """The reference (no fault) once, then every scenario on a fresh cluster; `overrides`: `--set`
    assignments on the chaos cluster (e.g. the transfer, cli/runtime.py: transfer_overrides)."""
    cfg = apply_overrides(chaos_config(model, policy), overrides or [])
    async with LocalCluster(cfg) as cluster:
        reference = await reference_run(cluster, num_requests, gen_tokens)
    results = []
    for name in scenarios:
        res = await run_scenario(replace(cfg), name, reference, gen_tokens)
        results.append(res)
        if on_result is not None:
            on_result(res)
    return {"config": report_config(cfg, {"model": model, "policy": policy, "num_requests": num_requests,
                                          "gen_tokens": gen_tokens}, "2P2D"),
            "results": [r.to_json() for r in results]}


async def reference_run(cluster: LocalCluster, num_requests: int, gen_tokens: int) -> list[list[int]]:
    """The two turns without a fault: every request's tokens, which each scenario must give."""
    reference, _ = await _two_turns(cluster, num_requests, gen_tokens, None)
    if any(not isinstance(r, list) for r in reference):
        raise RuntimeError("the fault-free reference run did not finish every request")
    return reference


def report_config(cfg: RuntimeConfig, run: dict, pd: str) -> dict:
    """The report's config: the run's parameters and the bounds the scenarios are held to."""
    return {**{k: run[k] for k in ("model", "policy", "num_requests", "gen_tokens")}, "pd": pd,
            "heartbeat_timeout_s": cfg.faults.heartbeat_timeout_s, "terminal_bound_s": TERMINAL_BOUND_S,
            "store_timeout_s": cfg.store.timeout_s, "store_bound_s": STORE_CALLS_ON_PATH * cfg.store.timeout_s,
            "store_retry_after_s": STORE_RETRY_AFTER_S, "widened": {**WIDENED, "store": STORE_WIDENED},
            "transport": {"kind": str(cfg.transport.kind), "transfer": str(cfg.transport.transfer)}}
