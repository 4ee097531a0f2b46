"""One scheduler, two worlds: the runtime's router, scripted with the simulator's events, drives
`GlobalScheduler` into the very passes the simulator drove it into.

The simulator runs a small contended cluster (one GPU per node, so a group is one engine as on
the runtime) and records, in order, every event that changes what the scheduler sees: arrivals,
passes, read completions, PE and DE releases. A real `Router` (no engine processes: fake outboxes,
store and host buffers) then gets the same events as its own inputs (`admit`, `_pass`, `ReadDone`,
`PrefillDone`, `DecodeDone`) and keeps its own ledgers from them. Every pass must be equal, and
the assignments the router sends its engines must carry the simulator's engines and read sides.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

pytest.importorskip("zmq")

from dualpath.config import EngineConfig, LinkConfig, RuntimeConfig, SchedulerConfig, SimConfig, WorkloadConfig, paper_cluster, parse_mode  # noqa: E402
from dualpath.core.blocks import chain_digests  # noqa: E402
from dualpath.core.request import RequestId, TurnSpec  # noqa: E402
from dualpath.core.scheduler import GlobalScheduler, SchedulePass  # noqa: E402
from dualpath.runtime.api import GenerationRequest, SamplingParams  # noqa: E402
from dualpath.runtime.protocol import DecodeAssign, DecodeDone, PrefillAssign, PrefillDone, ReadDone  # noqa: E402
from dualpath.runtime.router.router import Router  # noqa: E402
from dualpath.runtime.router.state import EngineState  # noqa: E402
from dualpath.sim.simulator import Simulator  # noqa: E402
from dualpath.workloads.trajectory import Trajectory  # noqa: E402
from fakes import RecordingOutbox  # noqa: E402

# The recorder subclasses the scheduler and wraps the simulator's methods: Python cannot subclass or
# patch mypyc's classes, so this runs on the pure-Python build (the suite's default, tests/conftest.py).
pytestmark = pytest.mark.pure_only

BLOCK_TOKENS = 64
# slow storage reads (0.2 GB/s, a 250th of the paper's 50 GB/s SNIC), so that reads queue and
# the read-side rule has both sides to choose from
SNIC_BYTES_PER_S = 2e8
NUM_AGENTS, NUM_TURNS = 16, 4


def _trajectories(num_agents: int, num_turns: int, seed: int) -> list[Trajectory]:
    """Turns whose append + generation is a whole number of blocks, so the runtime's DE
    reservation (prompt + max_tokens in whole blocks) equals the simulator's (prompt + generated)."""
    rng = random.Random(seed)
    out = []
    for a in range(num_agents):
        turns = []
        for _ in range(num_turns):
            append = rng.randint(200, 6000)
            gen = (-append) % BLOCK_TOKENS + BLOCK_TOKENS * rng.randint(1, 6)
            turns.append(TurnSpec(append, gen))
        out.append(Trajectory(a, tuple(turns)))
    return out


class _Recorder(GlobalScheduler):
    def __init__(self, inner: GlobalScheduler, log: list) -> None:
        self.__dict__.update(inner.__dict__)
        self._log = log
        self.closed_passes = 0

    def schedule(self, view):
        p = super().schedule(view)
        self._log.append(("pass", p))
        self.closed_passes += len(self._pe_open) < len(self._pe_groups)  # some PE group over beta
        return p


def _simulate(mode: str, seed: int):
    base = paper_cluster("ds-27b", "2P3D")
    cluster = replace(base, node=replace(base.node, gpus_per_node=1, storage_read_bytes_per_s=SNIC_BYTES_PER_S))
    trajs = _trajectories(NUM_AGENTS, NUM_TURNS, seed)
    # beta = 0.2 s of prefill (a 25th of the paper's 5 s), so that PE groups close and reopen
    cfg = SimConfig(cluster=cluster, workload=WorkloadConfig(num_agents=len(trajs)),
                    scheduler=SchedulerConfig(beta_compute_s=0.2))
    arrivals = [0.05 * i for i in range(len(trajs))]
    sim = Simulator(cfg, parse_mode(mode), trajs, arrivals)
    log: list = []
    sim.driver.scheduler = _Recorder(sim.driver.scheduler, log)
    submit, computed, finish, read_done = sim.driver.submit, sim.prefill_computed, sim._finish, sim.reads._done

    def on_submit(req):
        log.append(("submit", req.rid, req.input_tokens, req.gen_tokens))
        submit(req)

    def on_computed(req):
        log.append(("pe_done", req.rid, req.pe.eid))
        computed(req)

    def on_finish(req):
        log.append(("de_done", req.rid, req.de.eid, req.input_tokens + req.gen_tokens))
        finish(req)

    def on_read_done(flow):
        req, node = flow.tag.req, flow.tag.node  # a ReadPart (sim/state.py)
        log.append(("read_done", req.rid, node.nid, req.hit_tokens))
        read_done(flow)

    sim.driver.submit, sim.prefill_computed, sim._finish, sim.reads._done = on_submit, on_computed, on_finish, on_read_done
    sim.run()
    return sim, log


class _Region:
    offset_bytes = 0


class _Buffer:
    name = "fake"
    num_free_slots = 2**30

    def allocate(self):
        return _Region()

    def free(self, region) -> None:
        pass

    def check_invariants(self) -> None:
        pass




class _Store:
    """Stored blocks per agent: everything of its finished turns (the simulator's hit rule)."""

    def __init__(self) -> None:
        self.context_tokens: dict[bytes, int] = {}  # an agent's first digest -> its stored context

    def lookup(self, digests: list[bytes]) -> int:
        if not digests:
            return 0
        return min(len(digests), self.context_tokens.get(digests[0], 0) // BLOCK_TOKENS)


class _Clock:
    def now_s(self) -> float:
        return 0.0


def _router(sim: Simulator, mode: str, tmp_path) -> tuple[Router, dict[int, RecordingOutbox]]:
    cl = sim.cfg.cluster
    kvb = sim.kv_bytes_per_token
    cfg = RuntimeConfig(num_prefill=cl.num_prefill_nodes, num_decode=cl.num_decode_nodes, mode=mode,
                        block_tokens=BLOCK_TOKENS, links=LinkConfig(snic_bytes_per_s=cl.node.snic_read_bytes_per_s),
                        engines=EngineConfig(de_kv_tokens=int(sim.de_kv_hbm_bytes // kvb)), scheduler=sim.cfg.scheduler)
    buffers = {n.nid: _Buffer() for n in sim.nodes}
    router = Router(cfg, model_name="parity", tokenizer=None, max_context_tokens=2**30, eos_token_ids=(),
                    kv_bytes_per_token=kvb, full_block_bytes=kvb * BLOCK_TOKENS, store=_Store(),
                    endpoint=f"ipc://{tmp_path}/router", clock=_Clock())
    router.buffers.update(buffers)  # what each engine's Hello would have given
    outboxes = {}
    for n in sim.nodes:
        eid = n.engines[0].eid
        outboxes[eid] = RecordingOutbox()
        role = "prefill" if n.is_prefill else "decode"
        router.engines[eid] = EngineState(eid, role, f"fake://{eid}", kv_capacity_tokens=cfg.engines.de_kv_tokens,
                                          prefill_tokens_per_s=sim.prefill_tokens_per_s, outbox=outboxes[eid])
    router.new_scheduler()
    return router, outboxes


def _replay(router: Router, log: list) -> tuple[list[SchedulePass], dict[RequestId, int]]:
    """Feed the simulator's events to the router; its passes, and each sim request's router id."""
    inner = router.scheduler
    router.scheduler = rec = _Recorder(inner, [])
    rid_of: dict[RequestId, int] = {}
    first_digest: dict[int, bytes] = {}
    store: _Store = router.placement.store
    for ev in log:
        kind = ev[0]
        if kind == "submit":
            _, sim_rid, n, gen = ev
            prompt = tuple([sim_rid.agent + 1] * n)
            rr = router.admit(GenerationRequest(str(sim_rid), prompt, SamplingParams(max_tokens=gen, min_tokens=gen)))
            rid_of[sim_rid] = rr.rid
            first_digest[sim_rid.agent] = chain_digests(prompt[:BLOCK_TOKENS], BLOCK_TOKENS)[0]
        elif kind == "pass":
            router._pass()
        elif kind == "read_done":
            _, sim_rid, node, tokens = ev
            router._on_message(ReadDone(rid_of[sim_rid], node, tokens, 0, tokens // BLOCK_TOKENS))
        elif kind == "pe_done":
            router._on_message(PrefillDone(rid_of[ev[1]], ev[2]))
        elif kind == "de_done":
            _, sim_rid, de, context = ev
            store.context_tokens[first_digest[sim_rid.agent]] = context
            router._on_message(DecodeDone(rid_of[sim_rid], de))
        router.check_invariants()
    return [p for _, p in rec._log], rid_of


def _plain(p: SchedulePass, rename=lambda r: r) -> tuple:
    """A pass as plain values (the requests' `ref`s are each world's own records)."""
    def q(r) -> tuple:
        return (rename(r.rid), r.num_tokens, r.hbm_bytes, r.decode_tokens)

    return (tuple((q(a.req), a.engine) for a in p.prefill),
            tuple((q(d.req), d.engine, d.side, d.read_tokens) for d in p.decode))


@pytest.mark.parametrize("mode", ["dualpath", "basic", "basic+layerwise+de_read", "dualpath+tail"])
def test_router_and_simulator_drive_the_scheduler_into_the_same_passes(mode, tmp_path):
    sim, log = _simulate(mode, seed=7)
    assert sim.driver.scheduler.closed_passes > 10
    sim_passes = [p for kind, *rest in log if kind == "pass" for p in rest]
    decisions = sum(len(p.prefill) + len(p.decode) for p in sim_passes)
    assert decisions == 2 * NUM_AGENTS * NUM_TURNS  # every turn got a PE and a DE
    reads = [d for p in sim_passes for d in p.decode if d.read_tokens]
    assert len(reads) > 20  # later turns read their hits
    if mode != "basic":
        assert {d.side for d in reads} == {0, 1}  # both read paths in use

    router, outboxes = _router(sim, mode, tmp_path)
    try:
        router_passes, rid_of = _replay(router, log)
    finally:
        router.inbox.close()
    assert len(router_passes) == len(sim_passes)
    for i, (s, r) in enumerate(zip(sim_passes, router_passes)):
        assert _plain(s, lambda rid: RequestId(rid_of[rid], 0)) == _plain(r), f"pass {i} differs"

    # what the engines were told: the simulator's PE, DE and read side for every request
    sent = {}
    for box in outboxes.values():
        for m in box.sent:
            if isinstance(m, (PrefillAssign, DecodeAssign)):
                sent.setdefault(m.rid, {})[type(m).__name__] = m
    want = {}
    for p in sim_passes:
        for a in p.prefill:
            want.setdefault(rid_of[a.req.rid], {})["pe"] = a.engine
        for d in p.decode:
            want[rid_of[d.req.rid]].update(de=d.engine, side=int(d.side), hit=d.read_tokens)
    assert len(sent) == len(want) == NUM_AGENTS * NUM_TURNS
    for rid, w in want.items():
        pa, da = sent[rid]["PrefillAssign"], sent[rid]["DecodeAssign"]
        assert pa in outboxes[w["pe"]].sent and da in outboxes[w["de"]].sent
        assert pa.de_engine == w["de"] and pa.read_side == da.read_side == w["side"]
        assert pa.hit_tokens == da.hit_tokens == w["hit"]
    assert router.requests == {}  # every request ended on both engines
