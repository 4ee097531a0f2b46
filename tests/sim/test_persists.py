"""Persists that take time (sim/persists.py): the SNIC write bucket's timing, the hit model's
in-flight and stored blocks, and placement that waits for a hit block, as the runtime's router."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.metrics.timeline import NULL_TIMELINE
from dualpath.sim.cpu_share import NO_CPU_SHARE
from dualpath.sim.dram import NO_TIER
from dualpath.sim.events import EventLoop
from dualpath.sim.hits import StoreHits, TraceRequest, TrajectoryHits
from dualpath.sim.persists import PersistWrites, PlacementGate, filled_at_s
from dualpath.sim.simulator import Simulator
from dualpath.sim.state import Agent, SimRequest
from dualpath.core.request import TurnSpec
from dualpath.workloads import MooncakeRecord

BT = 4  # block tokens
KVB = 10  # KV bytes per token: a block is 40 bytes
RATE = 20.0  # SNIC bytes/s: a block's write takes 2 s once the bucket is empty


def _ctx(timed=True, wait_s=10.0, buffers=False):
    cluster = SimpleNamespace(persist_waits_for_snic_write=timed, persist_wait_s=wait_s, block_tokens=BT,
                              cnic_as_runtime_arbiter=False, node=SimpleNamespace(snic_bytes_per_s=RATE),
                              buffers_at_placement=buffers)
    io = SimpleNamespace(persists_take_time=lambda: True, reserves_buffers=lambda: True,
                         persist=lambda snic_out, nbytes, d2h=None, done=None, tag=None: nbytes, tokens_to_read=lambda req: req.hit_tokens)
    return SimpleNamespace(loop=EventLoop(), cfg=SimpleNamespace(cluster=cluster), features=SimpleNamespace(dram_tier=False),
                           kv_bytes_per_token=KVB, io=io, timeline=NULL_TIMELINE, cpu=NO_CPU_SHARE)


class _Log:
    instant_writes = False  # the writer times each block (`HitModel.instant_writes`)

    def __init__(self, loop):
        self.loop, self.got = loop, []

    def written(self, key):
        self.got.append((self.loop.now_s, key))


def _de():
    return SimpleNamespace(cnic_out=None, node=SimpleNamespace(nid=7, snic_out=None, write_track="SNIC node7 write", dram=NO_TIER))


@pytest.mark.pure_only
def test_one_writer_a_block_at_a_time_through_a_one_block_bucket():
    ctx = _ctx()
    log = _Log(ctx.loop)
    writes = PersistWrites(ctx, log, lambda: None)
    writes.submit([1, 2, 3], _de())  # at t=0: the full bucket pays the first block
    ctx.loop.call_at(10.0, lambda _: writes.submit([4], _de()))  # idle since t=4: refilled to one block
    ctx.loop.call_at(10.5, lambda _: writes.submit([5, 6], _de()))  # 0.5 s of refill: 10 bytes of 40
    ctx.loop.run()
    assert log.got == [(0.0, 1), (2.0, 2), (4.0, 3), (10.0, 4), (12.0, 5), (14.0, 6)]
    assert writes.persisted_bytes == 6 * BT * KVB and writes.num_written == 6


class _InstantLog(_Log):
    instant_writes = True

    def stored_now(self, keys):
        self.got += [(self.loop.now_s, k) for k in keys]


@pytest.mark.pure_only
def test_untimed_writes_end_at_once():
    ctx = _ctx(timed=False)
    log = _InstantLog(ctx.loop)
    PersistWrites(ctx, log, lambda: None).submit([1, 2], _de())
    assert log.got == [(0.0, 1), (0.0, 2)]  # inside submit: no event
    with pytest.raises(AssertionError, match="disagree"):  # a hit model that waits for writes no writer times
        PersistWrites(ctx, _Log(ctx.loop), lambda: None)


def _agent_turn(aid, input_tokens):
    agent = Agent(aid, (TurnSpec(input_tokens, 1),), 0.0)
    return SimRequest(agent, 0, input_tokens, 1, 0, 0.0)


def test_instant_writes_store_a_turn_at_once_as_its_blocks_one_by_one():
    """`stored_now` (untimed persists) leaves every agent's stored prefix where the same keys
    queued and written one by one leave it: in order, a short hit's blocks written again, a run
    past a gap that an earlier one fills."""
    b = 4
    timed, instant = TrajectoryHits(b), TrajectoryHits(b, instant_writes=True)
    turns = [(0, 0, 3), (0, 1, 5), (1, 2, 4), (1, 0, 2), (0, 5, 6), (2, 1, 3)]  # (agent, first block, last)
    for aid, first, last in turns:
        req = _agent_turn(aid, last * b)
        keys = timed._persist(req, first, last)
        for k in keys:
            timed.written(k)
        instant.stored_now(instant._persist(_agent_turn(aid, last * b), first, last))
        assert not instant.persisting and not timed.persisting
        assert instant._written_prefix == timed._written_prefix  # agent -> blocks 0.. all written
    assert instant._written_prefix == {0: 6, 1: 4, 2: 0} and instant._written[2] == {1, 2}


def _finished(input_tokens, gen, t_first, t_second, t_finish):
    r = SimRequest(Agent(0, (TurnSpec(input_tokens, gen),), 0.0), 0, input_tokens, gen, 0, 0.0)
    r.t_first, r.t_second, r.t_finish = t_first, t_second, t_finish
    return r


def test_a_generated_block_fills_when_the_step_after_its_last_token_ends():
    # 6 prompt tokens, 11 generated (positions 6..16), blocks of 4: block 1 (positions 4..7) is
    # full once token 1 (position 7) has KV, computed by the step that emits token 2; block 2
    # (8..11) by token 6's step, block 3 (12..15) by token 10's (the last, at t_finish); position 16
    # is the last token, no KV. Tokens 1..10 evenly from t_second = 1.0 to t_finish = 10.0.
    assert filled_at_s(_finished(6, 11, 0.5, 1.0, 10.0), BT) == [2.0, 6.0, 10.0]
    assert filled_at_s(_finished(6, 1, 0.5, 0.5, 0.5), BT) == []  # one token: its KV is never computed
    assert filled_at_s(_finished(7, 2, 0.5, 0.7, 0.7), BT) == [0.7]  # position 7 is the prefill's token


@pytest.mark.pure_only
def test_generated_blocks_are_written_from_when_they_filled():
    ctx = _ctx()
    log = _Log(ctx.loop)
    writes = PersistWrites(ctx, log, lambda: None)
    req = _finished(6, 11, 0.5, 1.0, 10.0)  # filled at 2, 6, 10 (above)
    ctx.loop.call_at(10.0, lambda _: writes.submit_generated([21, 22, 23], _de(), req))
    ctx.loop.run()
    # the first two were written during the decode (known at the turn's end), the third now
    assert log.got == [(10.0, 21), (10.0, 22), (10.0, 23)]
    w = writes._writers[7]
    assert w.free_at_s == 10.0 and writes.persisted_bytes == 3 * BT * KVB
    # a writer busy until 11 takes the blocks in order after its earlier work
    ctx2 = _ctx()
    log2 = _Log(ctx2.loop)
    writes2 = PersistWrites(ctx2, log2, lambda: None)
    ctx2.loop.call_at(5.0, lambda _: writes2.submit([1, 2, 3, 4], _de()))  # 5, 7, 9, 11
    ctx2.loop.call_at(10.0, lambda _: writes2.submit_generated([21, 22, 23], _de(), req))
    ctx2.loop.run()
    assert log2.got == [(5.0, 1), (7.0, 2), (9.0, 3), (11.0, 4), (13.0, 21), (15.0, 22), (17.0, 23)]


def _trace_req(aid, blocks, input_tokens, gen=3):
    rec = MooncakeRecord(0.0, input_tokens, gen, tuple(blocks))
    return TraceRequest.of(rec), rec


def test_store_hits_count_in_flight_blocks_for_the_decision_and_stored_ones_for_placement():
    a, _ = _trace_req(0, [1, 2, 3], 3 * 512 + 5)
    b, _ = _trace_req(1, [1, 2, 4], 3 * 512 + 5)
    hits = StoreHits([a, b], 512)
    first = SimRequest(Agent(0, a.turns, 0.0), 0, a.turns[0].append_tokens, 3, 0, 0.0)
    later = SimRequest(Agent(1, b.turns, 0.0), 0, b.turns[0].append_tokens, 3, 0, 0.0)
    assert hits.blocks == [(0, 1, 2), (0, 1, 3)]  # trace ids interned by the run's Rechunker
    assert hits.prompt_in_cache(first) == [0, 1, 2]
    assert hits.hit_tokens(later) == 2 * 512 and hits.stored_hit_tokens(later) == 0
    assert hits.blocked_by_persist(later)
    hits.written(0)
    assert hits.stored_hit_tokens(later) == 512 and hits.blocked_by_persist(later)
    hits.written(1)
    assert hits.stored_hit_tokens(later) == 2 * 512 and not hits.blocked_by_persist(later)  # block 3 is nobody's
    hits.written(2)
    assert not hits.persisting
    # generated blocks are written but never named: (input + gen - 1) // b - input // b of them
    assert hits.turn_finished(first) == []  # 1541 + 3 - 1 tokens of KV: no generated block filled


def test_trajectory_hits_follow_the_runtimes_last_token_rule():
    b = BT
    agent = Agent(0, (TurnSpec(6, 2), TurnSpec(3, 2)), 0.0)
    t0 = SimRequest(agent, 0, 6, 2, 0, 0.0)
    hits = TrajectoryHits(b, last_token_next_turn=True)
    assert hits.prompt_in_cache(t0) == [0]  # 6 tokens: one full block
    assert hits.turn_finished(t0) == []  # 8 tokens, KV of 7: block 1 is not full yet
    agent.context_tokens = 8
    t1 = SimRequest(agent, 1, 11, 2, 0, 0.0)
    assert hits.hit_tokens(t1) == 4 and hits.stored_hit_tokens(t1) == 0 and hits.blocked_by_persist(t1)
    hits.written(0)
    assert hits.stored_hit_tokens(t1) == 4 and not hits.blocked_by_persist(t1)
    t1.set_hit(4)
    assert hits.prompt_in_cache(t1) == [1]  # block 1 has KV now, written by this turn
    paper = TrajectoryHits(b)  # the paper's client: the whole earlier context
    a2 = Agent(1, agent.turns, 0.0)
    t2 = SimRequest(a2, 0, 6, 2, 0, 0.0)
    assert paper.prompt_in_cache(t2) == [1 << 24]
    assert paper.turn_finished(t2) == [(1 << 24) + 1]  # 8 tokens fill block 1
    # a turn that ends at its first token never joins a DE's batch: its prompt blocks go at its end,
    # as the runtime's DE persists them at the H2D copy it still makes (a 64-token round, then 1 token)
    a3 = Agent(2, (TurnSpec(2 * b, 1), TurnSpec(3, 2)), 0.0)
    one = SimRequest(a3, 0, 2 * b, 1, 0, 0.0)
    assert hits.turn_finished(one) == [(2 << 24) + 0, (2 << 24) + 1]  # KV of 8 tokens (the last: next turn's)
    assert paper.turn_finished(one) == [(2 << 24) + 0, (2 << 24) + 1]  # 9 tokens: block 2 not full


class _Hits:
    """Request -> (blocked until t, stored hit then; before it: blocked, `early` hit)."""

    def __init__(self, loop, plan):
        self.loop, self.plan = loop, plan

    def blocked_by_persist(self, req):
        until, _, _ = self.plan[req.rid.agent]
        return self.loop.now_s < until

    def stored_hit_tokens(self, req):
        until, early, late = self.plan[req.rid.agent]
        return late if self.loop.now_s >= until else early


def _req(aid, hit):
    r = SimRequest(Agent(aid, (TurnSpec(100, 2),), 0.0), 0, 100, 2, 0, 0.0)
    r.set_hit(hit)
    return r


def _gate(ctx, plan):
    placed = []
    life = SimpleNamespace(prefill_ready=lambda r: placed.append((ctx.loop.now_s, r.rid.agent, r.hit_tokens, "ready")))
    reads = SimpleNamespace(enqueue=lambda r, n: placed.append((ctx.loop.now_s, r.rid.agent, r.hit_tokens, "read")))
    return PlacementGate(ctx, _Hits(ctx.loop, plan), life, reads), placed


@pytest.mark.pure_only
def test_the_head_blocked_by_a_persist_holds_the_queue_until_the_write_ends():
    ctx = _ctx()
    node = SimpleNamespace(read_queue_tokens=0)
    gate, placed = _gate(ctx, {0: (2.0, 4, 8), 1: (0.0, 12, 12)})
    gate.admit(_req(0, 8), node, False)
    gate.admit(_req(1, 12), node, False)  # not blocked itself: waits behind the head (FIFO)
    assert placed == [] and node.read_queue_tokens == 20  # both still charged to the read side
    ctx.loop.call_at(2.0, lambda _: gate.pump())  # the write ends (PersistWrites.on_written)
    ctx.loop.run()
    assert placed == [(2.0, 0, 8, "read"), (2.0, 1, 12, "read")]
    assert node.read_queue_tokens == 0 and gate.num_waited == 1 and gate.num_gave_up == 0


@pytest.mark.pure_only
def test_after_persist_wait_s_placement_goes_on_with_what_is_stored():
    ctx = _ctx(wait_s=3.0)
    node = SimpleNamespace(read_queue_tokens=0)
    gate, placed = _gate(ctx, {0: (99.0, 4, 8), 1: (99.0, 0, 8)})
    gate.admit(_req(0, 8), node, False)
    gate.admit(_req(1, 8), node, True)  # recomputed: its hit is not waited for
    ctx.loop.run()
    assert placed == [(3.0, 0, 4, "read"), (3.0, 1, 8, "read")]  # the timer at +persist_wait_s
    assert gate.num_gave_up == 1


@pytest.mark.pure_only
def test_untimed_placement_is_immediate():
    ctx = _ctx(timed=False)
    node = SimpleNamespace(read_queue_tokens=0)
    gate, placed = _gate(ctx, {0: (99.0, 4, 8)})
    gate.admit(_req(0, 0), node, False)
    assert placed == [(0.0, 0, 0, "ready")] and node.read_queue_tokens == 0


def _placed_on(nodes, aid, hit, side):
    """A request of 10 prompt tokens (3 slots of BT = 4) assigned to PE node nodes[0] and DE node nodes[1]."""
    r = _req(aid, hit)
    r.input_tokens = 10
    r.pe, r.de = SimpleNamespace(node=nodes[0]), SimpleNamespace(node=nodes[1])
    r.side = side
    return r


@pytest.mark.pure_only
def test_placement_takes_the_prompts_buffer_slots_all_or_nothing_and_waits_for_room():
    from dualpath.core.snapshot import ReadSide
    from dualpath.sim.state import Node

    ctx = _ctx(timed=False, buffers=True)
    slot = BT * KVB  # 40 bytes: a 10-token prompt takes 3 slots, 120 bytes
    pe_node, de_node = Node(0, True, None, None, 5 * slot), Node(1, False, None, None, 4 * slot)
    gate, placed = _gate(ctx, {0: (0.0, 0, 0), 1: (0.0, 0, 0), 2: (0.0, 0, 0)})
    a = _placed_on((pe_node, de_node), 0, 0, ReadSide.PREFILL)
    gate.admit(a, de_node, False)
    assert placed == [(0.0, 0, 0, "ready")] and (a.de_buffer_bytes, a.pe_buffer_bytes) == (3 * slot, 3 * slot)
    assert de_node.buffer_free_bytes == slot and pe_node.buffer_free_bytes == 2 * slot
    b = _placed_on((pe_node, de_node), 1, 0, ReadSide.DECODE)  # DE path: the DE buffer only
    c = _placed_on((pe_node, de_node), 2, 0, ReadSide.PREFILL)
    gate.admit(b, de_node, False)
    gate.admit(c, pe_node, False)  # FIFO: behind b, though its own room would not help it either
    assert len(placed) == 1 and id(gate) in de_node.waiters and gate.num_buffer_waits == 1
    de_node.buffer_free_bytes += 3 * slot  # a's prompt KV is in HBM (Simulator.release_buffer pumps)
    a.de_buffer_bytes = 0.0
    gate.pump()
    # b takes the DE buffer's 3 free slots; c finds 1 and waits on the DE node
    assert [p[1] for p in placed] == [0, 1] and b.de_buffer_bytes == 3 * slot and b.pe_buffer_bytes == 0.0
    assert de_node.buffer_free_bytes == slot and pe_node.buffer_free_bytes == 2 * slot
    de_node.buffer_free_bytes += 3 * slot  # b's prompt is in HBM: c's DE slots fit, its PE slots do not
    gate.pump()
    assert [p[1] for p in placed] == [0, 1] and de_node.buffer_free_bytes == 4 * slot  # nothing held by c
    assert id(gate) in pe_node.waiters and c.de_buffer_bytes == 0.0 == c.pe_buffer_bytes
    pe_node.buffer_free_bytes += 3 * slot  # a's prefill ends (PrefillDone)
    gate.pump()
    assert [p[1] for p in placed] == [0, 1, 2] and (c.de_buffer_bytes, c.pe_buffer_bytes) == (3 * slot, 3 * slot)
    assert gate.num_buffer_waits == 2  # b and c, each counted once however often it looked


MC = 512


@pytest.mark.parametrize("mode", ["basic", "dualpath"])
def test_a_request_that_shares_blocks_being_written_waits_for_them(tmp_path, mode):
    """The later request arrives while the first's prompt blocks are written at a slow SNIC: the
    decision counts them, placement waits for the last it hits, and the read follows the write."""
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [9]}) + "\n")
    cl = paper_cluster("ds-27b", "1P1D")
    block_bytes = cl.block_tokens * cl.model_spec.kv_bytes_per_token
    rate = block_bytes / 0.5  # a block's write: 0.5 s
    cl = replace(cl, node=replace(cl.node, snic_bytes_per_s=rate, storage_read_bytes_per_s=None),
                 persist_waits_for_snic_write=True)
    cfg = SimConfig(cluster=cl, workload=WorkloadConfig(max_len_tokens=65536, num_agents=1, trajectory_file=str(path)),
                    check_invariants_every=1)
    first = TraceRequest.of(MooncakeRecord(0.0, 1100, 400, (1, 2, 3)))
    later = TraceRequest.of(MooncakeRecord(0.0, 1200, 5, (1, 2, 4)))
    probe = Simulator(cfg, parse_mode(mode), [first], [0.0])
    probe.run()
    # the first's prompt blocks are queued when its KV is in HBM: after its first token, by its second
    first_s, second_s = probe.recorder.first_s[0], probe.recorder.second_s[0]
    sim = Simulator(cfg, parse_mode(mode), [first, later], [0.0, second_s + 0.01])
    out = sim.run()
    rec = sim.recorder
    i = rec.agent.index(1)
    bt = cl.block_tokens
    n = 2 * MC // bt  # blocks the later request hits, all queued at the first's join
    assert rec.hit_tokens[i] == 2 * MC and n > 2
    # the bucket pays the first block at once, each next one 0.5 s later; the read follows the n-th
    read_end_s = rec.arrival_s[i] + rec.sched_s[i] + rec.alloc_s[i] + rec.read_s[i]
    assert read_end_s >= first_s + (n - 1) * 0.5
    assert out["persists"]["requests_waited"] == 1 and out["persists"]["requests_gave_up"] == 0
    # every full block of KV is written once: both prompts beyond their hits and the generated ones
    queued = (1100 + 400 - 1) // bt + (1200 + 5 - 1) // bt - n
    assert out["bytes"]["persisted"] == queued * block_bytes
    # the run ends at the last token: the first's generated blocks may still be on the writer then
    assert 1100 // bt <= out["persists"]["blocks_written"] <= queued
    assert not any(k in sim.hits.persisting for k in sim.hits.blocks[1][:n])
    untimed = Simulator(replace(cfg, cluster=replace(cl, persist_waits_for_snic_write=False)), parse_mode(mode),
                        [first, later], [0.0, second_s + 0.01])
    untimed.run()
    j = untimed.recorder.agent.index(1)
    assert untimed.recorder.first_s[j] < rec.first_s[i] - (n - 2) * 0.5  # no wait: it reads at once
