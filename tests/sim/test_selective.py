"""Decode-local prefill for short appends (`selective`, `+selective`; core/policy/local.py) in the
scheduler and the simulator: which requests skip the PE, where their hit is read, what their TTFT
is made of, what their chunks cost the DE's decoding batch, and every ledger at every event."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualpath.config import RuntimeConfig, SchedulerConfig, paper_cluster, parse_mode
from dualpath.core.policy import PrefillThresholds, prefill_locally
from dualpath.core.request import RequestId
from dualpath.core.scheduler import ClusterView, GlobalScheduler, SchedulerRules
from dualpath.core.snapshot import EngineLoad, QueuedRequest, ReadSide
from dualpath.errors import InputError

from sim_helpers import run

# two agents of long first rounds, then short appends (local at 512) and one long append (not)
AT_512 = SchedulerConfig(local_prefill_max_tokens=512)  # llm-d's threshold (docs/paper.md §10), over the default
SPEC = [[(6000 + 1000 * i, 40), (300, 60), (2000, 30), (100, 50), (40, 1)] for i in range(2)]


def test_the_modes_parse_in_both_worlds():
    sel = parse_mode("selective")
    assert sel.local_prefill and not sel.dualpath_scheduler and not sel.de_read_path
    both = parse_mode("dualpath+selective")
    assert both.local_prefill and both.dualpath_scheduler and both.de_read_path
    assert parse_mode("dualpath+split+selective+tail") == replace(parse_mode("dualpath+split"), local_prefill=True,
                                                                 tail_share=True)
    assert parse_mode("dualpath+tail+selective") == parse_mode("dualpath+selective+tail")
    assert not parse_mode("dualpath").local_prefill
    assert RuntimeConfig(mode="dualpath+selective").features.local_prefill  # the runtime's half: tests/runtime/cluster/test_runtime_selective.py
    with pytest.raises(InputError, match="local_prefill_max_tokens"):
        SchedulerConfig(local_prefill_max_tokens=0)


def test_the_rule():
    assert prefill_locally(512, 512) and prefill_locally(512, 0)
    assert not prefill_locally(512, 513) and not prefill_locally(512, None)


class _View(ClusterView):
    def __init__(self, hits: dict[int, int]) -> None:
        self.hits = hits

    def pe_loads(self, group):
        return [EngineLoad(0, 0, 0, 0)]

    def de_loads(self, group):
        return [EngineLoad(1, 1, 0, 0, 10**9)]

    def read_queue_tokens(self, node):
        return 0

    def read_tokens(self, ref):
        return self.hits[ref]


@pytest.mark.parametrize("dualpath", [True, False])
def test_a_short_append_skips_the_pe_and_its_read_takes_the_shorter_queue(dualpath):
    """Two short appends skip the PE queue; the first is read on its DE's node (both queues empty: a
    tie stays there). With DualPath's rules the second, finding the DE node's queue holding the
    first's hit, is read by the PE node, which relays it (`relay_node`); basic's reads stay on the DE."""
    rules = SchedulerRules(PrefillThresholds(10**6, 10**6), dualpath, dualpath, local_max_tokens=512)
    s = GlobalScheduler([0], [1], rules)
    reqs = {i: QueuedRequest(RequestId(i, 0), n, 1000, n + 10, u) for i, (n, u) in
            enumerate([(9000, 300), (9000, 600), (400, None), (5000, 512)])}
    for i, q in reqs.items():
        s.submit(q, i)
    p = s.schedule(_View({0: 8700, 1: 8400, 2: 0, 3: 4488}))
    assert [a.ref for a in p.prefill] == [1, 2]  # the long append and the unknown one, in FIFO order
    local = {d.ref: d for d in p.decode if d.local}
    assert sorted(local) == [0, 3] and [d.ref for d in p.decode][:2] == [0, 3]  # in the DE queue since their arrival
    assert all(d.read_tokens == {0: 8700, 3: 4488}[r] and not d.pe_part_tokens for r, d in local.items())
    assert (local[0].side, local[0].relay_node) == (ReadSide.DECODE, -1)
    assert (local[3].side, local[3].relay_node) == ((ReadSide.PREFILL, 0) if dualpath else (ReadSide.DECODE, -1))
    assert s.num_pe_queued == 0 and s.num_de_queued == 0


@pytest.mark.parametrize("mode", ["selective", "dualpath+selective"])
@pytest.mark.parametrize("at_placement", [False, True])
def test_the_local_requests_are_those_under_the_threshold_and_every_ledger_holds(mode, at_placement):
    """Also with host buffers taken at placement and persists awaited (the `local` preset's rules):
    a relayed read holds its slots on the relay node, checked with every ledger at every event."""
    cl = replace(paper_cluster("ds-27b", "1P1D"), buffers_at_placement=at_placement, persist_waits_for_snic_write=at_placement)
    sim, r = run(SPEC, mode=mode, cluster=cl, check_every=1, scheduler=AT_512)
    rec = sim.recorder
    local = [pe < 0 for pe in rec.pe_engine]
    uncached = [n - h for n, h in zip(rec.input_tokens, rec.hit_tokens)]
    assert sum(local) == r["scheduler"]["local_prefills"] >= 6
    assert all((u <= 512) == loc for u, loc in zip(uncached, local))  # trajectory hits: as expected at arrival
    sides = {side for side, loc in zip(rec.read_side, local) if loc}
    assert sides == ({int(ReadSide.DECODE)} if mode == "selective" else {int(ReadSide.DECODE), int(ReadSide.PREFILL)})
    # the hits are read once, whatever the path; the local ones through the DE node's SNIC
    kvb = sim.kv_bytes_per_token
    local_hits = sum(h for h, loc in zip(rec.hit_tokens, local) if loc) * kvb
    assert r["bytes"]["storage_to_prefill"] + r["bytes"]["storage_via_decode"] == pytest.approx(sum(rec.hit_tokens) * kvb)
    if mode == "selective":  # every local hit through the DE node's SNIC
        assert r["bytes"]["storage_via_decode"] >= local_hits > 0
    base, _ = run(SPEC, mode=mode.replace("+selective", "").replace("selective", "basic"))
    assert r["num_turns"] == len(base.recorder.hit_tokens) == 10


@pytest.mark.parametrize("chunk_tokens", [None, 100])
def test_a_lone_local_turns_ttft_is_its_read_its_copy_and_its_steps(chunk_tokens):
    """One agent, nothing else running: a local turn's TTFT is the hit's read over the DE node's SNIC,
    its copy into HBM over the DE's CNIC, then the decode steps carrying the append: one step, or
    ceil(miss / chunk) steps that share the chunks' cost when a step carries fewer tokens."""
    from dualpath.config import SimConfig, WorkloadConfig
    from dualpath.sim.simulator import Simulator
    from sim_helpers import trajs

    spec = [[(6000, 2), (300, 2)]]
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"), workload=WorkloadConfig(num_agents=1), check_invariants_every=1,
                    scheduler=AT_512)
    if chunk_tokens is not None:  # a step carries at most this many tokens; the rule still keeps 300 local
        cfg = replace(cfg, scheduler=SchedulerConfig(local_prefill_max_tokens=chunk_tokens))
    sim = Simulator(cfg, parse_mode("dualpath+selective"), trajs(spec), [0.0])
    if chunk_tokens is not None:
        sim.driver.scheduler.rules = replace(sim.driver.scheduler.rules, local_max_tokens=512)
    sim.run()
    rec, kvb = sim.recorder, sim.kv_bytes_per_token
    (i,) = [k for k, pe in enumerate(rec.pe_engine) if pe < 0]
    hit, n = rec.hit_tokens[i], rec.input_tokens[i]
    steps = 1 if chunk_tokens is None else -(-(n - hit) // chunk_tokens)
    assert steps == (1 if chunk_tokens is None else 4)
    node = sim.decode_nodes[0]
    cm = sim.compute
    want = (hit * kvb / node.snic_in.capacity_bytes_per_s + hit * kvb / node.engines[0].cnic_in.capacity_bytes_per_s
            + steps * cm.prefill_only_step_s() + cm.chunk_in_decode_s(hit, n - hit))
    assert rec.first_s[i] - rec.arrival_s[i] == pytest.approx(want, rel=1e-6)


def test_the_chunks_slow_the_des_decoding_batch():
    """A long-decoding agent shares its DE with another agent's local prefills: its steps are slower
    than beside the same agent prefilled on the PE; a miss over the threshold goes to the PE."""
    spec = [[(2000, 400)], [(5000, 2), (400, 2), (400, 2), (400, 2)]]
    _, local = run(spec, mode="dualpath+selective", check_every=1, scheduler=AT_512)
    _, pe = run(spec, mode="dualpath")
    assert local["scheduler"]["local_prefills"] == 3  # the three short appends (410-446 uncached tokens)
    assert local["tpot_s"]["p99"] > pe["tpot_s"]["p99"]
    _, r = run([[(700, 2)]], mode="dualpath+selective", scheduler=SchedulerConfig(local_prefill_max_tokens=256))
    assert r["scheduler"]["local_prefills"] == 0 and r["prefill_forwards"] == 1  # 700 uncached tokens: over 256


@pytest.mark.parametrize("mode", ["selective", "dualpath+selective"])
def test_the_local_preset_prefills_on_the_de_as_the_runtime_does(mode):
    """The `local` preset models the runtime: the DE's prefill a measured forward between its steps
    (`chunk_in_decode_s`), each local turn's TTFT at least that forward; selective's local hits all
    read on the DE's node, dualpath+selective's also relayed by the PE node; the demo's shape of turns (61-token appends, 62 uncached: all local at 64);
    every ledger at every event."""
    from dualpath.config import EngineConfig, LinkConfig
    from dualpath.core.request import TurnSpec
    from dualpath.costmodel.models import TINY
    from dualpath.fidelity.preset import local_sim_config
    from dualpath.sim.simulator import Simulator
    from dualpath.workloads import Trajectory
    from test_local_preset import _machine, _profile

    machine = _machine()
    rt = RuntimeConfig(model="tiny", links=LinkConfig(snic_bytes_per_s=2e6),
                       engines=EngineConfig(pe_hbm_bytes=int(machine.pe_landing_bytes), de_kv_tokens=4096))
    cfg = replace(local_sim_config(rt, _profile(machine), TINY.kv_bytes_per_token, "test"), check_invariants_every=1)
    assert cfg.scheduler.local_prefill_max_tokens == 64  # the default
    trajs = [Trajectory(a, (TurnSpec(126, 3),) + (TurnSpec(61, 3),) * 3) for a in range(3)]
    sim = Simulator(cfg, parse_mode(mode), trajs, [0.0] * 3)
    r = sim.run()
    rec = sim.recorder
    local = [i for i, pe in enumerate(rec.pe_engine) if pe < 0]
    assert len(local) == r["scheduler"]["local_prefills"] == 9  # every turn after the first
    relayed = [i for i in local if rec.read_side[i] == int(ReadSide.PREFILL)]
    assert (len(relayed) > 0) == (mode == "dualpath+selective")
    assert (r["bytes"]["storage_to_prefill"] > 0) == (mode == "dualpath+selective")
    cm = sim.compute
    for i in local:
        hit, n = rec.hit_tokens[i], rec.input_tokens[i]
        assert n - hit == 62 and rec.first_s[i] - rec.arrival_s[i] >= cm.chunk_in_decode_s(hit, n - hit) > 0
