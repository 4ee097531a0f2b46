"""Time from placement to first token, per read side, on the runtime (docs/experiments.md section 24).

Runs the `agents` fidelity workload once in dualpath mode on the local runtime cluster (about 7 min
on the 2-core machine) and stamps, in the router, when each request's assignments are sent
(`Router._send_assignments`) and when its `FirstToken` arrives; prints the mean, median and max of
that interval for the requests with a hit, by read side. A DE-path request waits for the decode
engine to serve its `LayerPull`s, which its loop does only between decode steps.

    python tools/fidelity_side_ttft.py [WORKLOAD]     # default: agents
"""

from __future__ import annotations

import asyncio
import collections
import statistics
import sys
import time

from dualpath.config import DEMO_AGENTS, RuntimeConfig
from dualpath.fidelity.run import _replan
from dualpath.fidelity.workloads import fidelity_workload
from dualpath.runtime.apps.demo import calibrate_for, plan_demo, run_demo
from dualpath.runtime.model import load_model
from dualpath.runtime.protocol import FirstToken
from dualpath.runtime.router import router as router_module

STAMPS: dict[int, dict] = collections.defaultdict(dict)
_send, _on_message = router_module.Router._send_assignments, router_module.Router._on_message


def _stamped_send(self, rr, prompt):
    STAMPS[rr.rid].update(assigned=time.perf_counter(), side=int(rr.side), hit=rr.hit_tokens)
    return _send(self, rr, prompt)


def _stamped_message(self, msg):
    if isinstance(msg, FirstToken):
        STAMPS[msg.rid]["first"] = time.perf_counter()
    return _on_message(self, msg)


def main(workload: str) -> None:
    router_module.Router._send_assignments, router_module.Router._on_message = _stamped_send, _stamped_message
    model = "smollm2-135m"
    window = load_model(model, device="cpu").model.config.max_position_tokens
    trajs = fidelity_workload(workload, window, None, RuntimeConfig(model=model).block_tokens)
    cal, kvbpt, block = calibrate_for(model, "cpu")
    plan = plan_demo(cal, kvbpt, block, DEMO_AGENTS, None, None)
    if trajs is not None:
        plan = _replan(plan, trajs, kvbpt, block)
    asyncio.run(run_demo(("dualpath",), plan=plan))
    rows = [d for d in STAMPS.values() if "first" in d and d.get("hit")]
    for side, name in ((0, "PE path"), (1, "DE path")):
        waits = [d["first"] - d["assigned"] for d in rows if d["side"] == side]
        if waits:
            print(f"{name}: {len(waits)} requests with a hit, assignment -> first token mean {statistics.mean(waits):.2f} s, "
                  f"median {statistics.median(waits):.2f} s, max {max(waits):.2f} s")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "agents")
