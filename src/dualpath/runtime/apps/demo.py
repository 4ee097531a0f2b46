"""`dualpath demo`: a local 1P1D cluster on the embedded defaults, an agentic replay in `basic`
then `dualpath` mode (or any modes, `--modes`, e.g. with `dualpath+split`), in the paper's
storage-bound regime on whatever machine runs it.

Workload: 4 agents; a first prompt of 190 tokens, then 61 appended tokens and exactly 3 generated
tokens per round (zero tool and think time, as the paper's replay; 3 tokens so TPOT, which excludes
the first two, is defined). The sizes are block aligned: after each round the KV of prompt + 2
generated tokens fills whole 64-token blocks, so every later round hits its entire context and
computes only 62 new tokens, as an agentic turn does. KV is float32: 46 KB per token for
SmolLM2-135M. The first prompt is short because every agent's first round is cold (compute only,
the same in both modes): the demo is about the rounds that load.

Rates and size (`emulation.py`): this machine's compute profile (`calibrate.py`, measured once and
cached) gives each turn's prefill time; the SNIC rate is chosen so that loading the hits through
one SNIC takes LOAD_OVER_COMPUTE (4.4) times the prefill compute, the CNIC of each one-engine node
runs at 8x that, and the number of rounds is the largest (3-24) whose predicted basic JCT fits
TARGET_BASIC_JCT_S, so that both modes finish in minutes on a slow machine as on a fast one.
`--snic-mb-s` and `--rounds` override.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable, Mapping

from ...config import DEMO_AGENTS, EngineConfig, LinkConfig, RuntimeConfig, TransportConfig
from ...config.tp import TensorParallelConfig
from ...core.request import TurnSpec
from ...metrics.decisions import DecisionLog
from ...metrics.timeline import Timeline
from ...workloads import Trajectory
from ..profile.calibrate import Calibration, check_speed, load_or_measure
from ..clock import MonotonicClock
from ..cluster import LocalCluster
from ..engine.cpus import available_cpus, plan_cpus
from ..protocol import EngineRole
from ..profile.emulation import EmulatedRates, derive_rates, given_rates, trajectory_turns
from .replay import TraceWorkload, num_turns, replay_workload, storage_read_bytes, summarise

FIRST_PROMPT_TOKENS = 190  # 3 blocks less the 2 generated tokens whose KV is computed
APPEND_TOKENS = 61  # + 3 generated: one 64-token block per round
GEN_TOKENS = 3
# Basic mode's predicted JCT the workload is sized to: with dualpath at ~0.55 of it and ~30 s of
# start-up, both modes take about 2.5 minutes (the demo's budget is 3).
TARGET_BASIC_JCT_S = 70.0
ROUNDS_RANGE = (3, 24)  # 24 rounds: 190 + 23 * 64 = 1,662 tokens of context, well inside the model's window


def demo_workload(num_agents: int = DEMO_AGENTS, rounds: int = 15, first_prompt_tokens: int = FIRST_PROMPT_TOKENS,
                  append_tokens: int = APPEND_TOKENS, gen_tokens: int = GEN_TOKENS) -> list[Trajectory]:
    turns = (TurnSpec(first_prompt_tokens, gen_tokens),) + (TurnSpec(append_tokens, gen_tokens),) * (rounds - 1)
    return [Trajectory(a, turns) for a in range(num_agents)]


def demo_config(mode: str, rates: EmulatedRates | None, model: str = "smollm2-135m") -> RuntimeConfig:
    return RuntimeConfig(model=model, mode=mode,
                         links=LinkConfig() if rates is None else LinkConfig(rates.snic_bytes_per_s, rates.cnic_bytes_per_s),
                         engines=EngineConfig(host_buffer_bytes=256 * 2**20, pe_hbm_bytes=128 * 2**20, de_kv_tokens=32768))


def cold_workload(num_agents: int = DEMO_AGENTS, rounds: int = 8) -> list[Trajectory]:
    """Nothing to load: every turn a fresh prompt as long as the demo's second round (254 tokens),
    3 generated (replayed with `cold=True`)."""
    turn = TurnSpec(FIRST_PROMPT_TOKENS + GEN_TOKENS + APPEND_TOKENS, GEN_TOKENS)
    return [Trajectory(a, (turn,) * rounds) for a in range(num_agents)]


def _workload_json(workload: list[Trajectory] | TraceWorkload, cold: bool) -> dict[str, Any]:
    if isinstance(workload, TraceWorkload):
        return {"cold": cold, "trace_requests": workload.num_turns, "num_turns": workload.num_turns,
                "time_scale": workload.time_scale}
    first = workload[0].turns
    return {"cold": cold, "num_agents": len(workload), "num_turns": num_turns(workload), "rounds": len(first),
            "first_prompt_tokens": first[0].append_tokens,
            "append_tokens": first[1].append_tokens if len(first) > 1 else 0, "gen_tokens": first[0].gen_tokens}


@dataclass(frozen=True, slots=True)
class DemoPlan:
    trajectories: list[Trajectory] | TraceWorkload  # a trace: `dualpath fidelity --workload mooncake`
    rates: EmulatedRates
    calibration: Calibration


def plan_demo(calibration: Calibration, kv_bytes_per_token: int, block_tokens: int, num_agents: int,
              rounds: int | None, snic_bytes_per_s: float | None) -> DemoPlan:
    """The workload and rates: given ones where given, else derived (rounds: the most that fit
    TARGET_BASIC_JCT_S)."""
    profile = calibration.profile

    def rates_for(trajs: list[Trajectory]) -> EmulatedRates:
        turns = [c for t in trajs for c in trajectory_turns([(s.append_tokens, s.gen_tokens) for s in t.turns], block_tokens)]
        if snic_bytes_per_s is not None:
            return given_rates(profile, turns, kv_bytes_per_token, snic_bytes_per_s)
        return derive_rates(profile, turns, kv_bytes_per_token)

    if rounds is not None:
        trajs = demo_workload(num_agents, rounds)
        return DemoPlan(trajs, rates_for(trajs), calibration)
    lo, hi = ROUNDS_RANGE
    r = hi
    trajs = demo_workload(num_agents, r)
    rates = rates_for(trajs)
    while r > lo and rates.predicted_basic_jct_s > TARGET_BASIC_JCT_S:
        r -= 1
        trajs = demo_workload(num_agents, r)
        rates = rates_for(trajs)
    return DemoPlan(trajs, rates, calibration)


def calibrate_for(model: str, device: str, num_engines: int = 2, force: bool = False,
                  check: bool = True) -> tuple[Calibration, int, int]:
    """The profile of a prefill engine of this cluster shape (its CPU set and threads), at this
    machine's speed now (`check`: a reused profile is timed again and scaled), plus the model's
    KV bytes per token and block size."""
    from ..engine.base import kv_dtype
    from ..model import load_model

    cfg = RuntimeConfig(model=model, device=device)
    mcfg = load_model(model, device="cpu").model.config
    plan = plan_cpus(range(num_engines), available_cpus(), cfg.engines.torch_threads)
    cal = load_or_measure(model, mcfg.fingerprint(), device, plan.threads_by_engine[0], plan.cpus_by_engine[0], force)
    if check:
        cal = check_speed(cal, model, plan.cpus_by_engine[0])
    kv_bytes = mcfg.kv_bytes_per_token_per_layer(kv_dtype(cfg)) * mcfg.num_layers
    return cal, kv_bytes, cfg.block_tokens


async def run_workload(cluster: LocalCluster, trajectories: list[Trajectory] | TraceWorkload,
                       on_turn: Callable[[int, Mapping[str, int]], None] | None = None, cold: bool = False,
                       record_decisions: bool = False) -> dict[str, Any]:
    """Trajectories (all at t = 0) or a Mooncake trace (open loop). `record_decisions`: the
    result's "decisions" holds the scheduler's decisions (metrics/decisions.py) with times from
    the replay's start. A cluster that records timelines (RuntimeConfig.record_timeline): the
    result's "timeline" is the run's Chrome trace (`runtime_trace`)."""
    cfg = cluster.cfg
    clock = MonotonicClock()
    router = cluster.router
    vocab = router.tokenizer.vocab_size
    if record_decisions:
        router.metrics.decisions = DecisionLog(router.clock.now_s())
    if cfg.record_timeline:  # the router's instants, and the engines' spans as their Counters bring them
        router.metrics.timeline = Timeline(router.clock.now_s(), router.clock.now_s)
    t0 = time.perf_counter()
    cb = None if on_turn is None else (lambda n: on_turn(n, storage_read_bytes(router)))  # turns done, bytes per node
    records = await replay_workload(router, trajectories, vocab, clock, cfg.seed, cb, cold)
    wall = time.perf_counter() - t0
    await asyncio.sleep(1.0)  # a last round of engine counters
    router.check_invariants()
    router = cluster.router
    counters = dict(router.metrics.engine_counters)
    result = summarise(records, router.metrics.summary(), wall, len({r.agent for r in records}))
    rate = cfg.links.snic_bytes_per_s
    result["mode"] = cfg.mode
    result["snic"] = {
        str(e): {"read_bytes": c.storage_read_bytes, "write_bytes": c.storage_write_bytes, "dram_read_bytes": c.dram_read_bytes,
                 "utilisation": (c.storage_read_bytes / (rate * result["jct_s"])) if rate else None,
                 "utilisation_while_reading": (c.storage_read_bytes / (rate * c.read_busy_s)) if rate and c.read_busy_s else None}
        for e, c in sorted(counters.items())
    }
    result["engine_busy_s"] = {str(e): c.busy_s for e, c in sorted(counters.items())}
    result["engine_roles"] = {str(e): router.engines[e].role.name.lower() for e in sorted(counters) if e in router.engines}
    # the decode engines' model time per decode step (their loop's own work excluded): `fidelity`
    # sets it beside the simulator's step time to split a TPOT error into model and loop
    de = [c for e, c in counters.items() if e in router.engines and router.engines[e].role == EngineRole.DECODE]
    pe = [c for e, c in counters.items() if e in router.engines and router.engines[e].role == EngineRole.PREFILL]
    # per role, the model time and the profile fit's terms of every forward (fidelity/speed.py)
    # and the CNIC link time the role's arbiters lost while the host could not copy at their rate
    result["model_time"] = {role: {"busy_s": sum(c.busy_s for c in cs), "forwards": sum(c.forwards for c in cs),
                                   "fit_terms": [sum(c.fit_terms[i] for c in cs) for i in range(3)],
                                   "cnic_stalled_s": sum(c.cnic_stalled_s for c in cs)}
                            for role, cs in (("prefill", pe), ("decode", de))}
    forwards = sum(c.forwards for c in de)
    result["de_step_s"] = sum(c.busy_s for c in de) / forwards if forwards else float("nan")
    result["de_batch_mean"] = sum(c.forward_items for c in de) / forwards if forwards else float("nan")
    result["de_served_mid_step"] = sum(c.served_mid_step for c in de)  # engine/mid_step.py
    if cfg.record_timeline:  # after the sleep above: the engines' last spans came with their last Counters
        result["timeline"] = router.metrics.timeline.to_chrome("runtime")
    if record_decisions:
        result["decisions"] = [asdict(d) for d in router.metrics.decisions.decisions]
        result["ttft_samples_s"] = [r.first_s - r.arrival_s for r in records]
        result["placed_hits"] = {f"a{r.agent}t{r.turn}": r.cached_tokens for r in records}
    return result


def runtime_trace(run: dict[str, Any]) -> dict[str, Any]:
    """The Chrome trace of one mode's run (a run of `run_demo(record_timeline=True)` or of
    `run_workload` on a recording cluster), taken out of the run's result (metrics/timeline.py)."""
    if "timeline" not in run:
        raise ValueError("this run recorded no timeline: run it with record_timeline=True")
    return run.pop("timeline")


async def run_demo(modes: tuple[str, ...] = ("basic", "dualpath"), snic_bytes_per_s: float | None = None,
                   model: str = "smollm2-135m", seed: int = 0,
                   on_turn: Callable[[str, int, int, Mapping[str, int]], None] | None = None,
                   num_agents: int = DEMO_AGENTS, rounds: int | None = None, device: str = "cpu",
                   plan: DemoPlan | None = None, cold_rounds: int = 0, record_decisions: bool = False,
                   tp: TensorParallelConfig | None = None, record_timeline: bool = False,
                   between_modes: Callable[[], None] | None = None, transport: TransportConfig | None = None,
                   pd: tuple[int, int] = (1, 1)) -> dict:
    """One cluster runs every mode in turn, each on a fresh, empty store (no restart between); each
    run's `jct_over_basic` is its JCT over basic's (None without a basic run).
    `snic_bytes_per_s` / `rounds` None: derived from this machine's profile (`plan_demo`).
    `cold_rounds` > 0: instead of the demo's agents, `cold_workload` at the same rates.
    `record_timeline`: each run's "timeline" is its Chrome trace (`runtime_trace`).
    `between_modes`: called after each mode's run but the last, the cluster idle (fidelity's drift check).
    `transport`: between the engines (default: one host's shared memory).
    `pd`: (prefill engines, decode engines), each with the plan's emulated SNIC and CNIC (default 1P1D)."""
    if plan is None:
        cal, kv_bytes, bt = calibrate_for(model, device)
        plan = plan_demo(cal, kv_bytes, bt, num_agents, rounds, snic_bytes_per_s)
    trajectories, rates = plan.trajectories, plan.rates
    if cold_rounds:
        trajectories = cold_workload(num_agents, cold_rounds)
    total = num_turns(trajectories)
    runs = []
    t0 = time.perf_counter()
    cluster_cfg = replace(demo_config(modes[0], rates, model), seed=seed, device=device, tp=tp or TensorParallelConfig(),
                          record_timeline=record_timeline, transport=transport or TransportConfig(),
                          num_prefill=pd[0], num_decode=pd[1])
    async with LocalCluster(cluster_cfg) as cluster:
        startup_s = time.perf_counter() - t0
        cpu_note = cluster.cpu_plan.note
        for i, mode in enumerate(modes):
            if i:
                if between_modes is not None:
                    between_modes()
                await cluster.switch_mode(mode)
            cb = None if on_turn is None else (lambda n, snic, m=mode: on_turn(m, n, total, snic))
            runs.append(await run_workload(cluster, trajectories, cb, cold=bool(cold_rounds), record_decisions=record_decisions))
    basic = next((r for r in runs if r["mode"] == "basic"), None)  # every mode's JCT against it, one cluster's runs
    for r in runs:  # the DE path must not slow the PE's forward: its busy seconds per turn, side by side
        r["pe_busy_s_per_turn"] = r["engine_busy_s"].get("0", 0.0) / max(1, r["num_turns"])
        r["jct_over_basic"] = None if basic is None else r["jct_s"] / basic["jct_s"]
    cal = plan.calibration
    return {
        "config": {"model": model, "pd": f"{pd[0]}P{pd[1]}D", "snic_bytes_per_s": rates.snic_bytes_per_s,
                   "transport": {"kind": str(cluster_cfg.transport.kind), "transfer": str(cluster_cfg.transport.transfer)},
                   "cnic_bytes_per_s": rates.cnic_bytes_per_s, "rates": rates.to_json(),
                   "kv_dtype": "float32", "seed": seed, "device": device, "cpus": cpu_note},
        "profile": {"path": None if cal.path is None else str(cal.path), "reused": cal.reused,
                    "machine": cal.profile.key.machine, "threads": cal.profile.key.threads,
                    "measure_wall_s": cal.profile.wall_s, "speed_now_over_cached": cal.speed_now_over_cached,
                    "prefill_s_64_over_1024": cal.profile.prefill_s(64, 1024)},
        "workload": _workload_json(trajectories, bool(cold_rounds)),
        "startup_s": startup_s,
        "runs": runs,
    }
