"""When each block is queued and written, and when each request is placed, in both worlds (issue
15, docs/experiments.md section 27).

Runs one fidelity workload once in one mode on the local runtime cluster, stamping in the router
(as `dualpath fidelity` runs it, with the decision log on): each `PersistQueued` (blocks, DE) and
`Persisted`, each request's assignments sent (`Router._send_assignments`: placement, with the hit
it fixed), its `PromptLoaded` and `FirstToken`. Then the simulator's `local` preset at that run's
own speed (fidelity/speed.py), stamping the same points (`PersistWrites.submit`,
`submit_generated`, `_written`; `PlacementGate._place`; `Simulator._join`). Prints, per request,
decided / placed / first token / PD transfer done (`PrefillDone`) / prompt in the DE and the placed hit, in both worlds; and the
writer of each world: blocks queued and written, and the blocks still waiting to be written at
each request's placement.

    python tools/fidelity_persist_times.py [WORKLOAD] [MODE] [--save=F | --runtime-from=F] [--reads]
        default: mooncake basic; --save: keep the runtime's stamps in F; --runtime-from: read them
        from F and run only the simulator; --reads: instead of the table, each request with a hit:
        its read side, placement and read end in both worlds
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys
from typing import Any

from dualpath.fidelity.preset import local_sim_config
from dualpath.fidelity.run import _simulate
from dualpath.fidelity.speed import at_speed, in_run_speed
from dualpath.runtime.apps.demo import demo_config, run_demo
from dualpath.runtime.protocol import FirstToken, Persisted, PersistQueued, PrefillDone, PromptLoaded, ReadDone
from dualpath.runtime.router import router as router_module
from dualpath.sim import persists as persists_module
from dualpath.sim import reads as reads_module
from dualpath.sim import simulator as simulator_module
from fidelity_side_ttft import fidelity_plan  # tools/: the same planning

STAMPS: dict[str, dict[str, dict]] = {"runtime": collections.defaultdict(dict), "sim": collections.defaultdict(dict)}
WRITES: dict[str, list[tuple[float, int]]] = {"runtime": [], "sim": []}  # (t_s, +n queued / -1 written)


def _rt_now(router: Any) -> float:
    log = router.metrics.decisions
    return router.clock.now_s() - (log.t0_s if log is not None else 0.0)


def _patch_runtime() -> None:
    send, on_message = router_module.Router._send_assignments, router_module.Router._on_message

    def stamped_send(self, rr, prompt):
        STAMPS["runtime"][rr.req.request_id].update(placed=_rt_now(self), hit=rr.hit_tokens)
        return send(self, rr, prompt)

    def stamped_message(self, msg):
        now = _rt_now(self)
        if isinstance(msg, PersistQueued):
            WRITES["runtime"].append((now, len(msg.digests)))
        elif isinstance(msg, Persisted):
            WRITES["runtime"].append((now, -1))
        elif isinstance(msg, (FirstToken, PromptLoaded, PrefillDone, ReadDone)) and msg.rid in self.requests:
            key = {FirstToken: "first", PromptLoaded: "loaded", PrefillDone: "pd_done", ReadDone: "read_done"}[type(msg)]
            STAMPS["runtime"][self.requests[msg.rid].req.request_id].setdefault(key, now)
        return on_message(self, msg)

    router_module.Router._send_assignments, router_module.Router._on_message = stamped_send, stamped_message


def _patch_sim() -> None:
    W, G, S = persists_module.PersistWrites, persists_module.PlacementGate, simulator_module.Simulator
    submit, submit_generated, written, place, join = W.submit, W.submit_generated, W._written, G._place, S._join
    landed = S.kv_landed

    def stamped_landed(self, req):
        STAMPS["sim"][name(req)].setdefault("pd_done", self.loop.now_s)
        return landed(self, req)

    S.kv_landed = stamped_landed
    R = reads_module.StorageReads
    read_done = R._done

    def stamped_read_done(self, flow):
        STAMPS["sim"][name(flow.tag[0])].setdefault("read_done", self.ctx.loop.now_s)
        return read_done(self, flow)

    R._done = stamped_read_done

    def name(req) -> str:
        return f"a{req.rid.agent}t{req.rid.turn}"

    def stamped_submit(self, keys, de):
        if keys:
            WRITES["sim"].append((self.ctx.loop.now_s, len(keys)))
        return submit(self, keys, de)

    def stamped_generated(self, keys, de, req):
        n0 = len(WRITES["sim"])
        out = submit_generated(self, keys, de, req)
        if len(WRITES["sim"]) == n0 and keys:  # the generated blocks, written from their fill times
            WRITES["sim"].append((self.ctx.loop.now_s, len(keys)))
        return out

    def stamped_written(self, key):
        WRITES["sim"].append((self.ctx.loop.now_s, -1))
        return written(self, key)

    def stamped_place(self, req, node):
        STAMPS["sim"][name(req)].update(placed=self.ctx.loop.now_s, hit=req.hit_tokens)
        return place(self, req, node)

    def stamped_join(self, req):
        STAMPS["sim"][name(req)].setdefault("loaded", self.loop.now_s)
        return join(self, req)

    W.submit, W.submit_generated, W._written, G._place, S._join = (stamped_submit, stamped_generated, stamped_written,
                                                                   stamped_place, stamped_join)


SIM_RECORDER: list = []


def _patch_recorder() -> None:
    init = simulator_module.Simulator.__init__

    def keep(self, *a, **k):
        init(self, *a, **k)
        SIM_RECORDER[:] = [self.recorder]

    simulator_module.Simulator.__init__ = keep


def _backlog(world: str, t_s: float) -> int:
    """Blocks queued and not yet written at `t_s`."""
    return sum(n if n > 0 else -1 for t, n in WRITES[world] if t <= t_s)


def _writer_line(world: str) -> str:
    w = WRITES[world]
    queued = sum(n for _, n in w if n > 0)
    ends = sorted(t for t, n in w if n < 0)
    gaps = [b - a for a, b in zip(ends, ends[1:])]
    busy = f", first write ended {ends[0]:.2f} s, last {ends[-1]:.2f} s, median gap {sorted(gaps)[len(gaps) // 2]:.3f} s" if gaps else ""
    peak = max((_backlog(world, t) for t, _ in w), default=0)
    return f"{world}: {queued} blocks queued, {len(ends)} written{busy}, peak backlog {peak} blocks"


def main(workload: str, mode: str, save: str | None = None, saved: str | None = None) -> None:
    _patch_runtime()
    _patch_sim()
    _patch_recorder()
    plan, cal, kvbpt = fidelity_plan(workload)
    if saved:  # the runtime's stamps from an earlier run of this tool (the simulator's side again)
        got = json.load(open(saved))
        run, STAMPS["runtime"], WRITES["runtime"] = got["run"], got["stamps"], got["writes"]
        STAMPS["runtime"] = collections.defaultdict(dict, STAMPS["runtime"])
    else:
        run = asyncio.run(run_demo((mode,), plan=plan, record_decisions=True))["runs"][0]
        if save:
            json.dump({"run": {k: run[k] for k in ("jct_s", "decisions", "model_time")}, "stamps": STAMPS["runtime"],
                       "writes": WRITES["runtime"]}, open(save, "w"))
    decided = {d["request"]: d for d in run.pop("decisions")}
    speed = in_run_speed(cal.profile, [run])
    cfg = local_sim_config(demo_config(mode, plan.rates, "smollm2-135m"), at_speed(cal.profile, speed), kvbpt,
                           source="fidelity_persist_times")
    sim_run, sim_log = _simulate(cfg, mode, plan.trajectories)
    sim_decided = {d.request: d for d in sim_log}
    rec = SIM_RECORDER[0]
    for a, t, first, arrival in zip(rec.agent, rec.turn, rec.first_s, rec.arrival_s):
        STAMPS["sim"][f"a{a}t{t}"]["first"] = first
    sizes = {f"a{i}t0": r.input_tokens for i, r in enumerate(plan.trajectories.records)} if hasattr(plan.trajectories, "records") else {}
    print(f"{workload}, {mode}: runtime JCT {run['jct_s']:.2f} s, sim {sim_run['jct_s']:.2f} s; in-run speed {speed}")
    print("runtime model time and CNIC link time lost (cnic_stalled_s):", run["model_time"])
    print(_writer_line("runtime"))
    print(_writer_line("sim"))
    if "--reads" in sys.argv:
        _reads(decided, sim_decided)
        return
    print("request (prompt tokens) | decided t (hit) rt / sim | placed t (hit) rt / sim | backlog at placement rt / sim | first token rt / sim | PD done rt / sim | prompt in DE rt / sim")
    for req in sorted(decided, key=lambda r: decided[r]["t_s"]):
        r, s = STAMPS["runtime"][req], STAMPS["sim"][req]
        d, sd = decided[req], sim_decided.get(req)
        print(f"{req:6} ({sizes.get(req, -1):5}) | {d['t_s']:6.2f} ({d['hit_tokens']:4}) / {sd.t_s if sd else float('nan'):6.2f} ({sd.hit_tokens if sd else -1:4})"
              f" | {r.get('placed', float('nan')):6.2f} ({r.get('hit', -1):4}) / {s.get('placed', float('nan')):6.2f} ({s.get('hit', -1):4})"
              f" | {_backlog('runtime', r.get('placed', 0.0)):4} / {_backlog('sim', s.get('placed', 0.0)):4}"
              f" | {r.get('first', float('nan')):6.2f} / {s.get('first', float('nan')):6.2f}"
              f" | {r.get('pd_done', float('nan')):6.2f} / {s.get('pd_done', float('nan')):6.2f} | {r.get('loaded', float('nan')):6.2f} / {s.get('loaded', float('nan')):6.2f}")


def _reads(decided: dict, sim_decided: dict) -> None:
    """The requests with a hit: read side, placement and read end in both worlds."""
    print("request | side rt / sim | decided t rt / sim | placed t rt / sim | read done rt / sim")
    for req in sorted(decided, key=lambda r: decided[r]["t_s"]):
        d, sd, r, s = decided[req], sim_decided.get(req), STAMPS["runtime"][req], STAMPS["sim"][req]
        if not d["hit_tokens"] or sd is None:
            continue
        mark = "" if d["side"] == sd.side else "  <- sides differ"
        print(f"{req:6} | {d['side'][:3]} / {sd.side[:3]} | {d['t_s']:6.2f} / {sd.t_s:6.2f} | {r.get('placed', float('nan')):6.2f} / "
              f"{s.get('placed', float('nan')):6.2f} | {r.get('read_done', float('nan')):6.2f} / {s.get('read_done', float('nan')):6.2f}{mark}")


if __name__ == "__main__":
    opts = {a.split("=")[0]: a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--") and "=" in a}
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    main(args[0] if args else "mooncake", args[1] if len(args) > 1 else "basic", opts.get("--save"), opts.get("--runtime-from"))
