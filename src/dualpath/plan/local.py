"""`dualpath plan --local`: which P/D shape and mode for this machine's local runtime cluster.

The paper presets' planner (search.py) sizes GPU nodes; this one sizes the cluster `dualpath demo`
and `dualpath run` start here: one engine per emulated node, each node with the SNIC and CNIC rates
the demo derives from this machine's compute profile (runtime/profile/emulation.py), a budget of
`engines` engines. Every P x D within the budget and every mode is simulated whole with the
simulator's `local` preset (fidelity/preset.py) on the workload (the demo's agents by default) and
ranked by JCT. Nothing the runtime ran calibrates it: the preset runs at the profile's speed as
checked at start (runtime/apps/demo.py: calibrate_for).

One thing the preset does not model is the CPUs the engines share: with more engines than CPUs the
runtime gives them no CPU sets (runtime/engine/cpus.py) and they slow each other down. The
prediction charges this as processor sharing at the predicted load: while the engines' summed busy
fraction B exceeds the CPUs C, every forward takes B / C times its profiled time, iterated to a
fixed point (`cpu_slowdown` in the output; 1.0 when the engines never want more than the CPUs).

`bench/plan_local.py` runs the same configurations on the runtime and compares the two rankings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..errors import InputError

DEFAULT_ENGINES = 3  # 1P1D and the shapes one engine larger: what a 2-core machine runs (runtime/engine/cpus.py)
MAX_ENGINES = 8  # each engine is a process with its own model copy; beyond this the machine, not the plan, decides
CPU_FIXED_POINT_ROUNDS = 6  # processor-sharing iterations (module docstring)
CPU_FIXED_POINT_TOLERANCE = 0.01  # stop when the slowdown moves by less than 1%


@dataclass(frozen=True, slots=True)
class LocalWorkload:
    """What every configuration runs: the trajectories, the emulated rates per node, the profile."""

    plan: Any  # runtime/apps/demo.py: DemoPlan (trajectories, rates, calibration)
    kv_bytes_per_token: int
    model: str

    @property
    def rates(self) -> Any:
        return self.plan.rates

    @classmethod
    def of_demo(cls, model: str, device: str = "cpu") -> "LocalWorkload":
        """The demo's agents and rates on this machine now (runtime/apps/demo.py: the profile timed
        again at start, plan_demo's rule)."""
        from ..config import DEMO_AGENTS
        from ..runtime.apps.demo import calibrate_for, plan_demo

        cal, kvbpt, block = calibrate_for(model, device)
        return cls(plan_demo(cal, kvbpt, block, DEMO_AGENTS, None, None), kvbpt, model)


def local_shapes(engines: int) -> list[tuple[int, int]]:
    """Every (P, D) with P, D >= 1 and P + D <= engines, smallest first."""
    if not 2 <= engines <= MAX_ENGINES:
        raise InputError(f"--engines must be 2 to {MAX_ENGINES} (one prefill and one decode engine at least), got {engines}")
    return sorted(((p, n - p) for n in range(2, engines + 1) for p in range(1, n)), key=lambda s: (sum(s), s))


def available_cpus() -> int:
    return len(os.sched_getaffinity(0))


def predict(work: LocalWorkload, pd: tuple[int, int], mode: str, cpus: int) -> dict[str, Any]:
    """One configuration simulated whole at the profile's speed, the CPUs shared (module docstring)."""
    slowdown, r = 1.0, _simulate(work, pd, mode, 1.0)
    for _ in range(CPU_FIXED_POINT_ROUNDS):
        wanted = max(1.0, busy_engines(r, pd) / cpus)
        if abs(wanted - slowdown) <= CPU_FIXED_POINT_TOLERANCE * slowdown:
            break
        slowdown, r = wanted, _simulate(work, pd, mode, wanted)
    return {"pd": f"{pd[0]}P{pd[1]}D", "mode": mode, "predicted": _latencies(r), "cpu_slowdown": slowdown,
            "busy_engines": busy_engines(r, pd), "utilisation": _utilisation(r, pd[0]),
            "binding": binding(_utilisation(r, pd[0])), "sim_wall_s": r["wall_s"],
            "command": _command(work, pd, mode)}


def plan_local(work: LocalWorkload, engines: int, modes: Sequence[str], cpus: int) -> list[dict[str, Any]]:
    """Every shape and mode, shortest predicted JCT first."""
    rows = [predict(work, pd, m, cpus) for pd in local_shapes(engines) for m in modes]
    return sorted(rows, key=lambda c: c["predicted"]["jct_s"])


def busy_engines(r: dict[str, Any], pd: tuple[int, int]) -> float:
    """The engines' summed busy fraction over the run: how many were computing, on average."""
    return pd[0] * r["gpu_busy"]["prefill_mean"] + pd[1] * r["gpu_busy"]["decode_mean"]


def binding(utilisation: dict[str, float]) -> str:
    """The busiest resource of the run (utilisation over its JCT)."""
    names = {"pe_snic": "PE SNIC", "de_snic": "DE SNIC", "cnic_max": "CNIC", "pe_busy": "prefill compute",
             "de_busy": "decode compute"}
    return names[max(names, key=lambda k: utilisation[k])]


def _utilisation(r: dict[str, Any], p: int) -> dict[str, float]:
    reads = r["nic_utilisation"]["snic_read_by_node"]  # prefill nodes first (config/sim.py: node ids)
    return {"pe_snic": sum(reads[:p]) / p, "de_snic": sum(reads[p:]) / max(1, len(reads) - p),
            "cnic_max": r["nic_utilisation"]["cnic_max"], "pe_busy": r["gpu_busy"]["prefill_mean"],
            "de_busy": r["gpu_busy"]["decode_mean"]}


def _latencies(r: dict[str, Any]) -> dict[str, float]:
    from .search import latencies

    return {k: v for k, v in latencies(r).items() if k != "goodput_rps"}


def _simulate(work: LocalWorkload, pd: tuple[int, int], mode: str, slowdown: float) -> dict[str, Any]:
    from ..config import parse_mode
    from ..fidelity.preset import local_sim_config
    from ..fidelity.speed import SpeedModel
    from ..runtime.apps.demo import demo_config
    from ..sim.simulator import Simulator

    runtime = replace(demo_config(mode, work.rates, work.model), num_prefill=pd[0], num_decode=pd[1])
    cal = work.plan.calibration
    source = f"profile {cal.path} (dualpath calibrate) at {slowdown:.3f}x its step times"
    cfg = local_sim_config(runtime, cal.profile, work.kv_bytes_per_token, source,
                           SpeedModel(prefill_scale=slowdown, decode_scale=slowdown))
    agents = list(work.plan.trajectories)
    return Simulator(cfg, parse_mode(mode), agents, [0.0] * len(agents)).run()


def _command(work: LocalWorkload, pd: tuple[int, int], mode: str) -> str:
    trajs = work.plan.trajectories
    return (f"dualpath demo --pd {pd[0]}P{pd[1]}D --modes {mode} --model {work.model} --agents {len(trajs)} "
            f"--rounds {len(trajs[0].turns)} --snic-mb-s {work.rates.snic_bytes_per_s / 1e6:.3f}")
