"""The fidelity simulator alone on the mooncake workload, with the `local` preset's persist_wait_s
as it is and without the limit, at a saved report's in-run speeds: what placement gave up, the hits
it fixed, JCT and TTFT (docs/experiments.md section 26).

    python tools/fidelity_persist_wait.py docs/results/fidelity/mooncake_s26p.json
"""

import json
import sys
from dataclasses import replace

from dualpath.fidelity.preset import local_sim_config
from dualpath.fidelity.speed import at_speed
from dualpath.fidelity.run import _simulate
from dualpath.runtime.apps.demo import demo_config
from fidelity_side_ttft import fidelity_plan  # tools/: the same planning


def main(report_path: str) -> None:
    rep = json.load(open(report_path))
    plan, cal, kvbpt = fidelity_plan("mooncake")
    for mode in rep["modes"]:
        cfg = local_sim_config(demo_config(mode, plan.rates, "smollm2-135m"),
                               at_speed(cal.profile, rep["modes"][mode]["in_run_speed"]), kvbpt, source="fidelity_persist_wait")
        real = rep["modes"][mode]["metrics"]
        print(f"{mode}: runtime JCT {real['jct_s']['runtime_mean']:.2f} s, TTFT p50 {real['ttft_p50_s']['runtime_mean']:.2f} s")
        for wait_s in (cfg.cluster.persist_wait_s, 1000.0):
            run, _ = _simulate(replace(cfg, cluster=replace(cfg.cluster, persist_wait_s=wait_s)), mode, plan.trajectories)
            print(f"  persist_wait_s {wait_s:g}: {run['persists']}, JCT {run['jct_s']:.2f} s, TTFT p50 "
                  f"{run['ttft_s']['p50']:.2f} s, placed hits {({k: v for k, v in run['placed_hits'].items() if v})}")


if __name__ == "__main__":
    main(sys.argv[1])
