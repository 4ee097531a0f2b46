"""One simulator run, timed two ways; used by tools/ab_sim_speed.sh so that the old and the new
revision are timed by the same code (whatever that revision's own `bench sim-speed` prints).

    PYTHONPATH=SRC python tools/sim_speed_driver.py AGENTS [--setup-only]   -> one JSON line {agents, wall_s, cpu_s, ...}

--setup-only builds the simulator and stops before running it: under `valgrind --tool=callgrind`
the difference of the two instruction counts is the run's, a count no other load on the machine
changes (tools/ab_sim_speed.sh's `callgrind` mode).

cpu_s is this process's CPU time (time.process_time) inside Simulator.run(): on a shared machine it
moves less than wall time when another process takes the core away.
"""

from __future__ import annotations

import json
import sys
import time

from dualpath._build import build_kind
from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode, parse_tokens
from dualpath.sim.runner import load_trajectories
from dualpath.sim.simulator import Simulator


def main() -> None:
    agents = int(sys.argv[1])
    cfg = SimConfig(cluster=paper_cluster("ds-v3.2-660b", "2P4D"),
                    workload=WorkloadConfig(max_len_tokens=parse_tokens("64k"), num_agents=agents, seed=1))
    trajs, arrivals = load_trajectories(cfg)
    sim = Simulator(cfg, parse_mode("dualpath"), trajs, arrivals)
    if "--setup-only" in sys.argv[2:]:
        print(json.dumps({"agents": agents, "setup_only": True, "build": build_kind()}))
        return
    wall0, cpu0 = time.perf_counter(), time.process_time()
    r = sim.run()
    wall_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
    print(json.dumps({"agents": agents, "wall_s": wall_s, "cpu_s": cpu_s, "jct_s": r["jct_s"],
                      "num_events": r["num_events"], "build": build_kind()}))


if __name__ == "__main__":
    main()
