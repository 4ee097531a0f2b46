"""`dualpath fidelity`: one workload, the local runtime cluster (repeated) and the simulator's
`local` preset (preset.py), per mode; the errors per metric (compare.py).

Numbered path:
  1. The workload (workloads.py: `demo`, `agents`, `tiny`, `mooncake`, or a file) and its emulated
     rates, derived from this machine's compute profile as the demo derives them
     (runtime/apps/demo.py: plan_demo); a trace's time scale from those rates (`_replan`).
  2. The runtime: `repeat` fresh clusters, each running every mode in turn on a fresh store, with
     the scheduler's decisions recorded (runtime/apps/demo.py: run_demo).
  3. The simulator: the same work arriving as the replay sends it (trajectories at t = 0, a trace
     at its scaled timestamps), one run per mode on the `local` preset, its decisions recorded
     (sim/dispatch.py). Its step times are the profile's at the machine's speed during that mode's
     runtime runs, measured from their own forwards (speed.py); the speed checked before the runs
     is the `sim_start_speed` ablation.
  4. compare.py: per mode and metric, the runtime's mean and spread, the simulator's value, the
     relative error against the goal; the decisions' agreement request by request.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import Any, Callable, Sequence

from ..config import DEMO_AGENTS, RuntimeConfig, parse_mode
from ..errors import InputError
from ..metrics.decisions import Decision, DecisionLog
from ..sim.simulator import Simulator
from ..runtime.apps.replay import TraceWorkload
from ..workloads import Trajectory
from .compare import compare_decisions, compare_mode
from .preset import local_sim_config
from .speed import at_speed, in_run_speed
from .workloads import fidelity_workload, trace_turn_costs

# A trace slice's arrivals span the time basic mode needs for it (the rates'
# first-order prediction, emulation.py): requests arrive faster than basic serves them, the
# paper's loaded regime, without sending everything at once. Chosen, not fitted.
TRACE_SPAN_OVER_BASIC_JCT = 1.0

async def run_fidelity(workload: str, modes: Sequence[str], repeat: int, model: str = "smollm2-135m",
                       device: str = "cpu", rounds: int | None = None,
                       on_turn: Callable[..., None] | None = None) -> dict[str, Any]:
    from ..runtime.apps.demo import calibrate_for, demo_config, plan_demo, run_demo
    from ..runtime.model import load_model

    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")
    for m in modes:
        parse_mode(m)
    window = load_model(model, device="cpu").model.config.max_position_tokens
    trajs = fidelity_workload(workload, window, rounds, RuntimeConfig(model=model).block_tokens)  # bad input: before timing
    cal, kvbpt, block = calibrate_for(model, device)
    plan = plan_demo(cal, kvbpt, block, DEMO_AGENTS, rounds, None)
    if trajs is not None:  # the same rate rule on this workload's turns
        plan = _replan(plan, trajs, kvbpt, block)
    longest = _longest_context(plan.trajectories)
    if longest > window:
        raise InputError(f"a trajectory of {longest} tokens does not fit {model}'s {window}-token window")
    t0 = time.perf_counter()
    runtime = [await run_demo(tuple(modes), model=model, device=device, plan=plan, record_decisions=True,
                              on_turn=on_turn, seed=i) for i in range(repeat)]
    runtime_wall_s = time.perf_counter() - t0
    source = f"profile {cal.path} (dualpath calibrate)"
    start_cfg = local_sim_config(demo_config(modes[0], plan.rates, model), cal.profile, kvbpt, source=source)
    report: dict[str, Any] = {"workload": workload, "model": model, "device": device, "repeat": repeat,
                              "rates": plan.rates.to_json(), "profile": None if cal.path is None else str(cal.path),
                              "speed_now_over_cached": cal.speed_now_over_cached,
                              **_workload_size(plan.trajectories),
                              "runtime_wall_s": runtime_wall_s, "local_preset": asdict(start_cfg.local), "modes": {}}
    for mode in modes:
        real_runs = [next(r for r in res["runs"] if r["mode"] == mode) for res in runtime]
        speed = in_run_speed(cal.profile, real_runs)  # speed.py: the machine during this mode's runs
        runtime_cfg = demo_config(mode, plan.rates, model)
        sim_cfg = local_sim_config(runtime_cfg, at_speed(cal.profile, speed), kvbpt,
                                   source=f"{source}, at the runs' own speed {speed}")
        at_start = local_sim_config(runtime_cfg, cal.profile, kvbpt, source=source)
        report["modes"][mode] = _mode_report(mode, real_runs, sim_cfg, at_start, plan.trajectories)
        report["modes"][mode].update(in_run_speed=speed, runtime_model_time=[r["model_time"] for r in real_runs])
    return report


def _mode_report(mode: str, real_runs: list[dict], sim_cfg: Any, start_cfg: Any,
                 work: list[Trajectory] | TraceWorkload) -> dict[str, Any]:
    """One mode: the simulator at the runs' own compute speed against the runtime, with two
    ablations (errors only): the profile at the speed checked before the runs, and the paper
    presets' CNICs (processor sharing, full duplex) in place of the runtime's arbiters (config.py)."""
    sim_run, sim_log = _simulate(sim_cfg, mode, work)
    logs = [[Decision(**d) for d in r.pop("decisions")] for r in real_runs]
    shared_cnics = replace(sim_cfg, cluster=replace(sim_cfg.cluster, cnic_as_runtime_arbiter=False))
    ablations = {"sim_shared_cnics": shared_cnics, "sim_start_speed": start_cfg}
    out: dict[str, Any] = {"metrics": compare_mode(real_runs, sim_run)}
    for name, cfg in ablations.items():
        run, _ = _simulate(cfg, mode, work)
        out[name] = {k: {"sim": v["sim"], "rel_error": v["rel_error"]}
                     for k, v in compare_mode(real_runs, run).items() if "rel_error" in v}
    out.update({"decisions": compare_decisions(logs, sim_log), "sim_wall_s": sim_run["wall_s"],
                "decision_logs": {"sim": [asdict(d) for d in sim_log], "runtime": [[asdict(d) for d in log] for log in logs]},
                "ttft_samples": {"sim": sim_run.get("ttft_samples_s", []),
                                 "runtime": [r.get("ttft_samples_s", []) for r in real_runs]},
                # per request, the hit tokens placement fixed (the decision's may be fewer or more)
                "placed_hits": {"sim": sim_run.get("placed_hits", {}),
                                "runtime": [r.pop("placed_hits", {}) for r in real_runs]}})
    return out


def _replan(plan: Any, trajs: list[Trajectory] | TraceWorkload, kvbpt: int, block: int) -> Any:
    """The demo's rate rule on this workload; a trace's time scale from the resulting rates."""
    from ..runtime.apps.emulation import derive_rates, trajectory_turns

    if isinstance(trajs, TraceWorkload):
        rates = derive_rates(plan.calibration.profile, trace_turn_costs(trajs.records, block), kvbpt)
        span_s = trajs.records[-1].timestamp_s - trajs.records[0].timestamp_s
        scale = TRACE_SPAN_OVER_BASIC_JCT * rates.predicted_basic_jct_s / span_s if span_s > 0 else 0.0
        return replace(plan, trajectories=replace(trajs, time_scale=scale), rates=rates)
    turns = [c for t in trajs for c in trajectory_turns([(s.append_tokens, s.gen_tokens) for s in t.turns], block)]
    return replace(plan, trajectories=trajs, rates=derive_rates(plan.calibration.profile, turns, kvbpt))


def _longest_context(work: list[Trajectory] | TraceWorkload) -> int:
    if isinstance(work, TraceWorkload):
        return max(r.input_tokens + r.output_tokens for r in work.records)
    return max(sum(t.append_tokens + t.gen_tokens for t in tr.turns) for tr in work)


def _workload_size(work: list[Trajectory] | TraceWorkload) -> dict[str, Any]:
    if isinstance(work, TraceWorkload):
        return {"num_agents": work.num_turns, "num_turns": work.num_turns, "time_scale": work.time_scale}
    return {"num_agents": len(work), "num_turns": sum(len(t.turns) for t in work)}


def _sim_workload(work: list[Trajectory] | TraceWorkload) -> tuple[list[Any], list[float]]:
    """Agents and arrivals as the runtime replay sends them (replay.py: replay_workload)."""
    if isinstance(work, TraceWorkload):
        from ..sim.hits import TraceRequest

        t0 = work.records[0].timestamp_s
        return [TraceRequest.of(r) for r in work.records], [(r.timestamp_s - t0) * work.time_scale for r in work.records]
    return list(work), [0.0] * len(work)


def _simulate(cfg: Any, mode: str, work: list[Trajectory] | TraceWorkload) -> tuple[dict, list[Decision]]:
    agents, arrivals = _sim_workload(work)
    sim = Simulator(cfg, parse_mode(mode), agents, arrivals)
    log = DecisionLog()
    sim.driver.decisions = log
    result = sim.run()
    rec = sim.recorder
    result["ttft_samples_s"] = [f - a for a, f in zip(rec.arrival_s, rec.first_s)]
    result["placed_hits"] = {f"a{a}t{t}": h for a, t, h in zip(rec.agent, rec.turn, rec.hit_tokens)}
    steps = sum(g.num_steps for g in sim.decode_groups.values())
    result["de_step_s"] = sum(g.busy_s for g in sim.decode_groups.values()) / steps if steps else float("nan")
    result["de_batch_mean"] = sum(g.seq_steps for g in sim.decode_groups.values()) / steps if steps else float("nan")
    return result, log.decisions
