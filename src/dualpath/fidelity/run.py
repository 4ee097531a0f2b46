"""`dualpath fidelity`: one workload, the local runtime cluster (repeated) and the simulator's
`local` preset (preset.py), per mode; the errors per metric (compare.py).

Numbered path:
  1. The workload (`demo`: the demo's agents and rounds; `agents`: a small Table-2-style set
     truncated to the model's window; or a trajectory file) and its emulated rates, derived from
     this machine's compute profile as the demo derives them (runtime/apps/demo.py: plan_demo).
  2. The runtime: `repeat` fresh clusters, each running every mode in turn on a fresh store, with
     the scheduler's decisions recorded (runtime/apps/demo.py: run_demo).
  3. The simulator: the same trajectories, all arriving at t = 0 as the replay sends them, one run
     per mode on the `local` preset, its decisions recorded (sim/dispatch.py).
  4. compare.py: per mode and metric, the runtime's mean and spread, the simulator's value, the
     relative error against the goal; the decisions' agreement request by request.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import DEMO_AGENTS, parse_mode
from ..core.request import TurnSpec
from ..errors import InputError
from ..metrics.decisions import Decision, DecisionLog
from ..sim.simulator import Simulator
from ..workloads import Trajectory
from .compare import compare_decisions, compare_mode
from .preset import local_sim_config

WORKLOADS = ("demo", "agents", "tiny")


def workload_trajectories(name: str, max_context_tokens: int, rounds: int | None) -> list[Trajectory] | None:
    """None for `demo` (the demo's own plan sizes it); `agents`: 8 generated agents (Table 2's 32K
    calibration) truncated to the model's window; `tiny`: 2 agents x 3 rounds (tests); else a
    trajectory JSONL file, truncated to the window."""
    if name == "demo":
        return None
    if name == "tiny":
        turns = (TurnSpec(60, 3),) + (TurnSpec(61, 3),) * ((rounds or 3) - 1)
        return [Trajectory(a, turns) for a in range(2)]
    if name == "agents":
        from ..workloads import generate

        limit = min(max_context_tokens, 2048) - 64
        return [t.truncate(limit) for t in generate(32768, 8, 1, append_scale=limit / 32768)]
    path = Path(name)
    if path.is_file():
        from ..workloads import WorkloadFormat, detect_format, read_trajectories

        if detect_format(path) is WorkloadFormat.MOONCAKE:
            raise InputError(f"{name}: Mooncake traces are not compared by `fidelity` yet (trajectory JSONL only)")
        return [t.truncate(max_context_tokens - 64) for t in read_trajectories(path)]
    raise InputError(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}, or a trajectory JSONL file")


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
    trajs = workload_trajectories(workload, window, rounds)
    cal, kvbpt, block = calibrate_for(model, device)
    plan = plan_demo(cal, kvbpt, block, DEMO_AGENTS, rounds, None)
    if trajs is not None:  # the same rate rule on this workload's turns
        plan = _replan(plan, trajs, kvbpt, block)
    longest = max(sum(t.append_tokens + t.gen_tokens for t in tr.turns) for tr in plan.trajectories)
    if longest > window:
        raise InputError(f"a trajectory of {longest} tokens does not fit {model}'s {window}-token window")
    t0 = time.perf_counter()
    runtime = [await run_demo(tuple(modes), model=model, device=device, plan=plan, record_decisions=True,
                              on_turn=on_turn, seed=i) for i in range(repeat)]
    runtime_wall_s = time.perf_counter() - t0
    sim_cfg = local_sim_config(demo_config(modes[0], plan.rates, model), cal.profile, kvbpt,
                               source=f"profile {cal.path} (dualpath calibrate)")
    report: dict[str, Any] = {"workload": workload, "model": model, "device": device, "repeat": repeat,
                              "rates": plan.rates.to_json(), "profile": None if cal.path is None else str(cal.path),
                              "num_agents": len(plan.trajectories), "num_turns": sum(len(t.turns) for t in plan.trajectories),
                              "runtime_wall_s": runtime_wall_s, "local_preset": asdict(sim_cfg.local), "modes": {}}
    for mode in modes:
        sim_run, sim_log = _simulate(sim_cfg, mode, plan.trajectories)
        real_runs = [next(r for r in res["runs"] if r["mode"] == mode) for res in runtime]
        logs = [[Decision(**d) for d in r.pop("decisions")] for r in real_runs]
        report["modes"][mode] = {"metrics": compare_mode(real_runs, sim_run),
                                 "decisions": compare_decisions(logs, sim_log),
                                 "sim_wall_s": sim_run["wall_s"],
                                 "decision_logs": {"sim": [asdict(d) for d in sim_log],
                                                   "runtime": [[asdict(d) for d in log] for log in logs]},
                                 "ttft_samples": {"sim": sim_run.get("ttft_samples_s", []),
                                                  "runtime": [r.get("ttft_samples_s", []) for r in real_runs]}}
    return report


def _replan(plan: Any, trajs: list[Trajectory], kvbpt: int, block: int) -> Any:
    from ..runtime.apps.emulation import derive_rates, trajectory_turns

    turns = [c for t in trajs for c in trajectory_turns([(s.append_tokens, s.gen_tokens) for s in t.turns], block)]
    return replace(plan, trajectories=trajs, rates=derive_rates(plan.calibration.profile, turns, kvbpt))


def _simulate(cfg: Any, mode: str, trajs: list[Trajectory]) -> tuple[dict, list[Decision]]:
    sim = Simulator(cfg, parse_mode(mode), trajs, [0.0] * len(trajs))
    log = DecisionLog()
    sim.driver.decisions = log
    result = sim.run()
    rec = sim.recorder
    result["ttft_samples_s"] = [f - a for a, f in zip(rec.arrival_s, rec.first_s)]
    return result, log.decisions
