"""`dualpath fidelity`: does the simulator predict runs it never saw?

Numbered path:
  1. The scored workload and the calibration workloads (workloads.py), each with its emulated rates
     derived from this machine's compute profile as the demo derives them (runtime/apps/demo.py:
     plan_demo; a trace's time scale from those rates and its `load`, `_replan`). A workload never
     calibrates its own prediction.
  2. Calibration: each calibration workload runs once per mode on the local runtime cluster, the
     profile's drift timed right before and right after each run. Their forwards, every mode's
     together, give the engines' contention.
  3. The scored runs: `repeat` fresh clusters, each running every mode in turn on a fresh store, the
     drift timed after each run, the scheduler's decisions recorded. Once every cluster has run,
     the session's checks are smoothed (a running median of three) and each run takes the drift at
     its middle, between the checks right before and right after it (calibration.py: `smoothed`).
  4. The simulator, `local` preset (preset.py), the same work arriving as the replay sends it, once
     per scored run of each mode (paired with it), at four speeds (speed.py: SpeedModel):
     `predicted` (fitted on the calibration runs, at the drift measured beside that run: nothing
     measured from the scored runs), `replayed` (fitted on that run's own forwards: a diagnostic),
     `start_speed` (drift only, no contention: an ablation), and `shared_cnics` (predicted, with
     the paper presets' CNICs in place of the runtime's arbiters).
  5. compare.py: per mode and metric, the runtime's mean, spread and noise, each simulation's
     error against its runs and the goal's verdict; for a missed goal the cause the runs measured;
     the decisions' agreement, run by run.
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
from .calibration import CalibrationRuns, DriftCheck, predicted_speed, smoothed, step_records
from .compare import causes, compare_decisions, errors, runtime_stats
from .preset import local_sim_config
from .speed import Drift, SpeedModel, fit_speed
from .workloads import WorkloadSpec, fidelity_workload, parse_workload, trace_turn_costs

DEFAULT_CALIBRATION = ("demo",)  # used when the scored workload is not the demo
DEMO_CALIBRATION = ("mooncake",)  # the demo's own prediction calibrates on the trace slice


async def run_fidelity(workload: str, modes: Sequence[str], repeat: int, model: str = "smollm2-135m",
                       device: str = "cpu", calibrate_on: Sequence[str] | None = None,
                       on_turn: Callable[..., None] | None = None, timeline: bool = False) -> dict[str, Any]:
    """The report (module docstring). `timeline`: each mode's report holds `timeline`, the Chrome
    trace of the predicted simulation beside the first scored runtime run (metrics/timeline.py)."""
    from ..runtime.apps.demo import calibrate_for
    from ..runtime.model import load_model

    if repeat < 1:
        raise InputError(f"--repeat must be at least 1, got {repeat}")
    for m in modes:
        parse_mode(m)
    spec = parse_workload(workload)
    cal_specs = _calibration_specs(spec, calibrate_on)
    window = load_model(model, device="cpu").model.config.max_position_tokens
    base, kvbpt, block = calibrate_for(model, device, check=False)
    for s in (spec, *cal_specs):  # bad input: one line before the drift check times anything
        _plan(s, base, kvbpt, block, model, window)
    drift = DriftCheck(model, device)
    checks = [drift(base)]  # the session's drift checks in time order: before the first run, after each run
    now = replace(base, profile=base.profile.scaled(checks[0].prefill))  # the rates follow the prefill speed
    plan = _plan(spec, now, kvbpt, block, model, window)
    cal_plans = [_plan(c, now, kvbpt, block, model, window) for c in cal_specs]
    jobs = [(c.key, p, 1000 + i, False) for i, (c, p) in enumerate(zip(cal_specs, cal_plans))]
    jobs += [(spec.key, plan, i, timeline and i == 0) for i in range(repeat)]
    clusters, walls_s = await _clusters(jobs, modes, model, device, lambda: checks.append(drift(base)), on_turn)
    n_cal = len(cal_specs)
    calib, mode_drifts = _drifts(clusters, checks, n_cal, modes)
    calib.wall_s = sum(walls_s[:n_cal])
    scored = [runs for _, runs in clusters[n_cal:]]
    report: dict[str, Any] = {
        "workload": spec.key, "model": model, "device": device, "repeat": repeat,
        "rates": plan.rates.to_json(), "profile": None if base.path is None else str(base.path),
        **_workload_size(plan.trajectories), "runtime_wall_s": sum(walls_s[n_cal:]),
        "calibration": calib.to_json(base.profile),
        "drift_checks": [d.to_json() for d in checks], "drift_levels": [d.to_json() for d in smoothed(checks)],
        "drift": [d.to_json() for d in checks[-repeat * len(modes) - 1:-1]],  # before each scored run, in order
        "drift_after": [d.to_json() for d in checks[-repeat * len(modes):]],
        "drift_by_mode": {m: [d.to_json() for d in ds] for m, ds in mode_drifts.items()}, "modes": {}}
    for mode in modes:
        real_runs = [next(r for r in runs if r["mode"] == mode) for runs in scored]
        speeds, by_run = _speeds(calib, base.profile, real_runs, mode_drifts[mode])
        runtime_cfg = _demo_config(mode, plan.rates, model)
        source = f"profile {base.path} (dualpath calibrate)"
        cfgs = {name: [local_sim_config(runtime_cfg, base.profile, kvbpt, f"{source} at {s}", s) for s in ss]
                for name, ss in by_run.items()}
        cfgs["shared_cnics"] = [replace(c, cluster=replace(c.cluster, cnic_as_runtime_arbiter=False)) for c in cfgs["predicted"]]
        report["modes"][mode] = _mode_report(real_runs, cfgs, {k: v.to_json() for k, v in speeds.items()}, mode,
                                             plan.trajectories, timeline)
        report["modes"][mode]["speed_by_run"] = {k: [v.to_json() for v in vs] for k, vs in by_run.items()}
    report["local_preset"] = asdict(cfgs["predicted"][0].local)
    report["profile_fit"] = {"prefill": asdict(base.profile.prefill_fit), "decode": asdict(base.profile.decode_fit)}
    report["profile_points"] = {"prefill": [asdict(p) for p in base.profile.prefill],
                                "decode": [asdict(p) for p in base.profile.decode]}
    return report


def _speeds(calib: CalibrationRuns, profile: Any, real_runs: Sequence[dict],
            drifts: Sequence[Drift]) -> tuple[dict[str, SpeedModel], dict[str, list[SpeedModel]]]:
    """A mode's speeds: per run (paired, compare.py), `predicted` the calibration's at the drift
    beside run i, `replayed` fitted on run i's own forwards, `start_speed` the drift alone; and one
    of each over every run, as a summary (the mean drift; every run's forwards)."""
    calibrated, cal_drift = calib.speed(profile), calib.mean_drift()
    summary = {"predicted": predicted_speed(calibrated, cal_drift, drifts),
               "replayed": fit_speed(profile, [(r["steps"], 1.0) for r in real_runs]),
               "start_speed": predicted_speed(SpeedModel(), 1.0, drifts)}
    by_run = {"predicted": [predicted_speed(calibrated, cal_drift, [d]) for d in drifts],
              "replayed": [fit_speed(profile, [(r["steps"], 1.0)]) for r in real_runs],
              "start_speed": [predicted_speed(SpeedModel(), 1.0, [d]) for d in drifts]}
    return summary, by_run


def _calibration_specs(spec: WorkloadSpec, calibrate_on: Sequence[str] | None) -> list[WorkloadSpec]:
    names = calibrate_on if calibrate_on is not None else (DEMO_CALIBRATION if spec.name == "demo" else DEFAULT_CALIBRATION)
    specs = [parse_workload(n) for n in names if n != "none"]
    for c in specs:
        if c.key == spec.key:
            raise InputError(f"workload {spec.key!r} cannot calibrate its own prediction: pass --calibrate-on "
                             f"another workload (or none: the speed checked before each run only)")
    return specs


async def _clusters(jobs: Sequence[tuple[str, Any, int, bool]], modes: Sequence[str], model: str, device: str,
                    check: Callable[[], None], on_turn: Callable[..., None] | None) -> tuple[list, list[float]]:
    """Each job (workload key, plan, seed, keep its trace) on a fresh cluster running every mode in
    turn, the drift `check`ed after each run (between two modes, the cluster idle; after the last,
    the cluster gone): its (key, runs) and its seconds."""
    clusters, walls_s = [], []
    for key, plan, seed, keep in jobs:
        t0 = time.perf_counter()
        res = await _run(plan, modes, model, device, seed=seed, on_turn=on_turn, keep_trace=keep, between_modes=check)
        walls_s.append(time.perf_counter() - t0)
        clusters.append((key, res["runs"]))
        check()
    return clusters, walls_s


def _drifts(clusters: Sequence[tuple[str, list]], checks: Sequence[Drift], n_cal: int,
            modes: Sequence[str]) -> tuple[CalibrationRuns, dict[str, list[Drift]]]:
    """Every run's drift: the j-th run of the session ran between checks j and j + 1, smoothed
    (calibration.py: `smoothed`), and takes the drift of its middle. The first
    `n_cal` clusters are the calibration's; the rest the scored ones, whose drifts are kept per mode."""
    levels = smoothed(checks)
    calib = CalibrationRuns()
    mode_drifts: dict[str, list[Drift]] = {m: [] for m in modes}
    j = 0
    for k, (key, runs) in enumerate(clusters):
        through = [levels[j + i].toward(levels[j + i + 1], 0.5) for i in range(len(runs))]
        j += len(runs)
        if k < n_cal:
            calib.add(key, runs, through)
            calib.last_after = checks[j]
        else:
            for run, d in zip(runs, through):
                mode_drifts[run["mode"]].append(d)
    return calib, mode_drifts


async def _run(plan: Any, modes: Sequence[str], model: str, device: str, seed: int,
               on_turn: Callable[..., None] | None, keep_trace: bool = False,
               between_modes: Callable[[], None] | None = None) -> dict[str, Any]:
    """One cluster running every mode (`between_modes` called between two of them); each run's
    forwards as `steps` (calibration.py: step_records), read from its timeline, which stays in the
    run as `trace` only with `keep_trace`."""
    from ..runtime.apps.demo import run_demo, runtime_trace

    res = await run_demo(tuple(modes), model=model, device=device, plan=plan, record_decisions=True,
                         on_turn=on_turn, seed=seed, record_timeline=True, between_modes=between_modes)
    for run in res["runs"]:
        trace = runtime_trace(run)
        run["steps"] = step_records(trace)
        if keep_trace:
            run["trace"] = trace
    return res


def _demo_config(mode: str, rates: Any, model: str) -> RuntimeConfig:
    from ..runtime.apps.demo import demo_config

    return demo_config(mode, rates, model)


def _plan(spec: WorkloadSpec, calibration: Any, kvbpt: int, block: int, model: str, window: int) -> Any:
    """The workload and its rates (the demo's rule), checked against the model's `window` tokens."""
    from ..runtime.apps.demo import plan_demo

    trajs = fidelity_workload(spec, window, block)
    rounds = None
    if spec.name == "demo":
        rounds = int(spec.number("rounds", int)) or None  # 0: as many as fit plan_demo's target
    plan = plan_demo(calibration, kvbpt, block, DEMO_AGENTS, rounds, None)
    if trajs is not None:  # the same rate rule on this workload's turns
        load = spec.number("load") if spec.name == "mooncake" else 1.0
        try:
            plan = _replan(plan, trajs, kvbpt, block, load)
        except ValueError as e:  # emulation.py: a workload with nothing to load
            raise InputError(f"workload {spec.key!r}: {e}") from None
    longest = _longest_context(plan.trajectories)
    if longest > window:
        raise InputError(f"a trajectory of {longest} tokens does not fit {model}'s {window}-token window")
    return plan


def _mode_report(real_runs: list[dict], cfgs: dict[str, Any], speeds: dict[str, dict[str, float]], mode: str,
                 work: list[Trajectory] | TraceWorkload, timeline: bool = False) -> dict[str, Any]:
    """One mode: the runtime's statistics, each simulation's errors, the causes of the prediction's
    misses, the decisions of both worlds (and the two worlds' timelines side by side)."""
    from ..metrics.timeline import merge_traces

    stats = runtime_stats(real_runs)
    sims = {name: [_simulate(cfg, mode, work, timeline and name == "predicted" and i == 0) for i, cfg in enumerate(runs)]
            for name, runs in cfgs.items()}  # per run of the runtime, its own simulation
    errs = {name: errors(stats, [run for run, _, _ in runs]) for name, runs in sims.items()}
    pred_run, pred_log, pred_trace = sims["predicted"][0]  # beside the runtime's first run
    logs = [[Decision(**d) for d in r.pop("decisions")] for r in real_runs]
    out = {
        "runtime": stats, "errors": errs, "speed": speeds,
        "causes": causes(errs["predicted"], errs["replayed"], speeds),
        "decisions": compare_decisions(logs, [log for _, log, _ in sims["predicted"]], cfgs["predicted"][0].cluster.block_tokens),
        "sim_wall_s": pred_run["wall_s"],
        "runtime_model_time": [r["model_time"] for r in real_runs], "runtime_steps": [r["steps"] for r in real_runs],
        "decision_logs": {"sim": [asdict(d) for d in pred_log], "runtime": [[asdict(d) for d in log] for log in logs]},
        "ttft_samples": {"sim": [x for run, _, _ in sims["predicted"] for x in run.get("ttft_samples_s", [])],
                         "runtime": [r.get("ttft_samples_s", []) for r in real_runs]},
        # per request, the hit tokens placement fixed (the decision's may be fewer or more)
        "placed_hits": {"sim": pred_run.get("placed_hits", {}), "runtime": [r.pop("placed_hits", {}) for r in real_runs]},
    }
    if timeline:
        out["timeline"] = merge_traces(pred_trace, real_runs[0].pop("trace"))
    return out


def _replan(plan: Any, trajs: list[Trajectory] | TraceWorkload, kvbpt: int, block: int, load: float = 1.0) -> Any:
    """The demo's rate rule on this workload; a trace's arrivals span the rates' predicted basic JCT
    over `load` (1.0: requests arrive as fast as basic mode serves them, the paper's loaded regime,
    without sending everything at once)."""
    from ..runtime.profile.emulation import derive_rates, trajectory_turns

    if isinstance(trajs, TraceWorkload):
        rates = derive_rates(plan.calibration.profile, trace_turn_costs(trajs.records, block), kvbpt)
        span_s = trajs.records[-1].timestamp_s - trajs.records[0].timestamp_s
        scale = rates.predicted_basic_jct_s / load / span_s if span_s > 0 else 0.0
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


def _simulate(cfg: Any, mode: str, work: list[Trajectory] | TraceWorkload,
              timeline: bool = False) -> tuple[dict, list[Decision], dict | None]:
    from ..metrics.timeline import NULL_TIMELINE, Timeline
    from ..sim.runner import sim_trace

    agents, arrivals = _sim_workload(work)
    sim = Simulator(cfg, parse_mode(mode), agents, arrivals, timeline=Timeline() if timeline else NULL_TIMELINE)
    log = DecisionLog()
    sim.driver.decisions = log
    result = sim.run()
    rec = sim.recorder
    result["ttft_samples_s"] = [f - a for a, f in zip(rec.arrival_s, rec.first_s)]
    result["placed_hits"] = {f"a{a}t{t}": h for a, t, h in zip(rec.agent, rec.turn, rec.hit_tokens)}
    steps = sum(g.num_steps for g in sim.decode_groups.values())
    result["de_step_s"] = sum(g.busy_s for g in sim.decode_groups.values()) / steps if steps else float("nan")
    result["de_batch_mean"] = sum(g.seq_steps for g in sim.decode_groups.values()) / steps if steps else float("nan")
    return result, log.decisions, sim_trace(sim) if timeline else None
