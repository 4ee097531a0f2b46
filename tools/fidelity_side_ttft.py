"""Per-request timings of one fidelity workload on the runtime (docs/experiments.md section 24).

Runs the workload once in dualpath mode on the local runtime cluster (the demo: about 1 min on
the 2-core machine; agents: about 7 min) and stamps, in the router, when each request's
assignments are sent (`Router._send_assignments`), when its `FirstToken` arrives and when its DE
reports `PromptLoaded` (the H2D done). It prints, for the requests with a hit, by read side:
assignment -> first token, and first token -> PromptLoaded; how many first tokens came within
5 ms of another (requests that shared a prefill forward); and how many messages the decode
engines served between a step's layers (engine/mid_step.py).

    python tools/fidelity_side_ttft.py [WORKLOAD] [--between-steps]
        WORKLOAD: demo | agents (default) | mooncake | FILE
        --between-steps: the decode engines serve their mail only between steps (the ablation of
        RuntimeConfig.de_serves_mid_step)
"""

from __future__ import annotations

import asyncio
import collections
import statistics
import sys
import time
from dataclasses import replace

from dualpath.config import DEMO_AGENTS, RuntimeConfig
from dualpath.fidelity.run import _replan
from dualpath.fidelity.workloads import fidelity_workload
from dualpath.runtime.apps import demo as demo_module
from dualpath.runtime.apps.demo import calibrate_for, plan_demo, run_demo
from dualpath.runtime.model import load_model
from dualpath.runtime.protocol import FirstToken, PromptLoaded
from dualpath.runtime.router import router as router_module

SHARED_FORWARD_S = 0.005  # first tokens this close came out of one forward (a forward takes >= 40 ms)
STAMPS: dict[int, dict] = collections.defaultdict(dict)
_send, _on_message = router_module.Router._send_assignments, router_module.Router._on_message


def _stamped_send(self, rr, prompt):
    STAMPS[rr.rid].update(assigned=time.perf_counter(), side=int(rr.side), hit=rr.hit_tokens)
    return _send(self, rr, prompt)


def _stamped_message(self, msg):
    if isinstance(msg, FirstToken):
        STAMPS[msg.rid]["first"] = time.perf_counter()
    elif isinstance(msg, PromptLoaded):
        STAMPS[msg.rid]["loaded"] = time.perf_counter()
    return _on_message(self, msg)


def _summary(name: str, values: list[float]) -> str:
    return f"{name} mean {statistics.mean(values):.3f} s, median {statistics.median(values):.3f} s, max {max(values):.3f} s"


def fidelity_plan(workload: str, model: str = "smollm2-135m"):
    """The workload planned as `dualpath fidelity` plans it: (plan, calibration, KV bytes per token)."""
    window = load_model(model, device="cpu").model.config.max_position_tokens
    trajs = fidelity_workload(workload, window, None, RuntimeConfig(model=model).block_tokens)
    cal, kvbpt, block = calibrate_for(model, "cpu")
    plan = plan_demo(cal, kvbpt, block, DEMO_AGENTS, None, None)
    if trajs is not None:
        plan = _replan(plan, trajs, kvbpt, block)
    return plan, cal, kvbpt


def main(workload: str, mid_step: bool) -> None:
    router_module.Router._send_assignments, router_module.Router._on_message = _stamped_send, _stamped_message
    if not mid_step:
        config = demo_module.demo_config
        demo_module.demo_config = lambda *a, **k: replace(config(*a, **k), de_serves_mid_step=False)
    plan, _cal, _kvbpt = fidelity_plan(workload)
    run = asyncio.run(run_demo(("dualpath",), plan=plan))["runs"][0]
    done = [d for d in STAMPS.values() if "first" in d]
    firsts = sorted(d["first"] for d in done)
    shared = sum(1 for a, b in zip(firsts, firsts[1:]) if b - a < SHARED_FORWARD_S)
    print(f"{workload}, dualpath, DE mail {'between layers' if mid_step else 'between steps only'}: {len(done)} requests; {shared} first tokens within {1e3 * SHARED_FORWARD_S:.0f} ms of the previous one; "
          f"JCT {run['jct_s']:.2f} s; the DEs served {run['de_served_mid_step']} messages between a step's layers")
    for side, name in ((0, "PE path"), (1, "DE path")):
        rows = [d for d in done if d["side"] == side and d.get("hit")]
        if rows:
            loaded = [d["loaded"] - d["first"] for d in rows if "loaded" in d]
            print(f"{name}, {len(rows)} requests with a hit: {_summary('assignment -> first token', [d['first'] - d['assigned'] for d in rows])}; "
                  + (_summary("first token -> PromptLoaded", loaded) if loaded else ""))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--between-steps"]
    main(args[0] if args else "agents", "--between-steps" not in sys.argv[1:])
