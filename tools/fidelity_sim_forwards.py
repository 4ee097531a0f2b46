"""The demo in the simulator's `local` preset with each CNIC model (docs/experiments.md section 24).

For the runtime's arbiters (FIFO per lane, the preset's model) and for shared full-duplex CNICs
(processor sharing, the paper presets' model), in dualpath mode: how many requests each prefill
forward held, how many H2D copies started while another was running on the DE's CNIC, and the
mean H2D time. Seconds of CPU; the demo's plan from this machine's profile, as `fidelity` makes it.

    python tools/fidelity_sim_forwards.py
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import replace

from dualpath.config import DEMO_AGENTS, parse_mode
from dualpath.fidelity.preset import local_sim_config
from dualpath.fidelity.run import _sim_workload
from dualpath.runtime.apps.demo import calibrate_for, demo_config, plan_demo
from dualpath.sim.simulator import Simulator


def one_run(cfg, trajectories) -> str:
    agents, arrivals = _sim_workload(trajectories)
    sim = Simulator(cfg, parse_mode("dualpath"), agents, arrivals)
    sizes: collections.Counter[int] = collections.Counter()
    group = next(iter(sim.prefill_groups.values()))
    start_compute, to_hbm, h2d_done = group._start_compute, sim.io.to_decode_hbm, sim._h2d_done
    started: dict[object, float] = {}
    overlapped, h2d_s = [0], []

    def counted_compute(fwd):
        sizes[len(fwd.entries)] += 1
        return start_compute(fwd)

    def timed_h2d(req, nbytes, cnic, done):
        overlapped[0] += any(cnic[0].flows)
        started[req.rid] = sim.loop.now_s
        return to_hbm(req, nbytes, cnic, done)

    def h2d_end(flow):
        h2d_s.append(sim.loop.now_s - started[flow.tag.rid])
        return h2d_done(flow)

    group._start_compute, sim.io.to_decode_hbm, sim._h2d_done = counted_compute, timed_h2d, h2d_end
    sim.run()
    return (f"forwards by requests held {dict(sorted(sizes.items()))}; {overlapped[0]} of {len(h2d_s)} H2D copies "
            f"started beside another; H2D mean {statistics.mean(h2d_s):.3f} s")


def main() -> None:
    cal, kvbpt, block = calibrate_for("smollm2-135m", "cpu")
    plan = plan_demo(cal, kvbpt, block, DEMO_AGENTS, None, None)
    cfg = local_sim_config(demo_config("dualpath", plan.rates, "smollm2-135m"), cal.profile, kvbpt, source="profile")
    shared = replace(cfg, cluster=replace(cfg.cluster, cnic_as_runtime_arbiter=False))
    print("arbiters (FIFO):", one_run(cfg, plan.trajectories))
    print("shared CNICs:   ", one_run(shared, plan.trajectories))


if __name__ == "__main__":
    main()
