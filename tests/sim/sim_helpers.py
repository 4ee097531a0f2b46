from __future__ import annotations

from dualpath.config import ClusterConfig, SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.core.request import TurnSpec
from dualpath.sim.simulator import Simulator
from dualpath.workloads.trajectory import Trajectory


def trajs(spec: list[list[tuple[int, int]]]) -> list[Trajectory]:
    return [Trajectory(i, tuple(TurnSpec(a, g) for a, g in turns)) for i, turns in enumerate(spec)]


def run(spec, mode="dualpath", cluster: ClusterConfig | None = None, arrivals=None, check_every=0, **sim_kw):
    cluster = cluster or paper_cluster("ds-27b", "1P1D")
    cfg = SimConfig(cluster=cluster, workload=WorkloadConfig(num_agents=max(1, len(spec))), check_invariants_every=check_every, **sim_kw)
    t = trajs(spec)
    sim = Simulator(cfg, parse_mode(mode), t, arrivals or [0.0] * len(t))
    result = sim.run()
    return sim, result
