"""The fidelity simulator alone, with `decode_waits_for_step_end` on and off, against the runtime
means of a saved report (docs/experiments.md section 25).

The workload is planned as `dualpath fidelity` plans it: the cached profile, its speed checked now,
and the rates derived from it. So the simulator sees this moment's speed, not the report's. It
prints each metric's relative error against the report's runtime mean.

    python tools/fidelity_sim_only.py WORKLOAD REPORT.json    # e.g. agents docs/results/fidelity/agents_dualpath_s25.json
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace

from dualpath.fidelity.compare import _METRICS
from dualpath.fidelity.preset import local_sim_config
from dualpath.fidelity.run import _simulate
from dualpath.runtime.apps.demo import demo_config
from fidelity_side_ttft import fidelity_plan  # tools/: the same planning

METRICS = ("jct_s", "ttft_p50_s", "ttst_mean_s", "tpot_mean_s", "de_step_s")


def main(workload: str, report_path: str) -> None:
    model = "smollm2-135m"
    plan, cal, kvbpt = fidelity_plan(workload, model)
    with open(report_path) as f:
        report = json.load(f)
    print(f"profile speed now / cached: {cal.speed_now_over_cached:.3f}")
    for mode, entry in report["modes"].items():
        cfg = local_sim_config(demo_config(mode, plan.rates, model), cal.profile, kvbpt, source="fidelity_sim_only")
        for waits in (True, False):
            run, _ = _simulate(replace(cfg, cluster=replace(cfg.cluster, decode_waits_for_step_end=waits)), mode, plan.trajectories)
            errors = {k: f"{_METRICS[k](run) / entry['metrics'][k]['runtime_mean'] - 1:+.1%}"
                      for k in METRICS if entry["metrics"][k]["runtime_mean"]}
            print(f"{workload} {mode}, {'at step ends' if waits else 'fluid join'}: {errors}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
