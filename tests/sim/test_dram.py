"""The host-DRAM tier in the simulator (`+dram`; sim/dram.py): what a node's tier holds, what a read
takes from it instead of the SNIC, and the modes' results with every ledger checked at every event."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualpath.config import ClusterConfig, paper_cluster, parse_mode
from dualpath.errors import InputError
from dualpath.sim.dram import BlockTier, RunTier

from sim_helpers import run

SPEC = [[(6000 + 1000 * i, 40), (300, 60), (2000, 30), (100, 50), (40, 1)] for i in range(3)]
STRIDE = 1 << 24  # hits.py: an agent's persisted block keys


def test_the_modes_and_the_capacity():
    assert parse_mode("dualpath+dram").dram_tier and parse_mode("basic+dram+selective").dram_tier
    assert parse_mode("dualpath+dram") == replace(parse_mode("dualpath"), dram_tier=True)
    assert not parse_mode("dualpath").dram_tier
    with pytest.raises(InputError, match="dram_tier_gb_per_node"):
        ClusterConfig(dram_tier_gb_per_node=-1)


def test_a_run_tier_merges_what_touches_and_evicts_whole_runs():
    t = RunTier(capacity_bytes=10 * 100, block_tokens=64, block_bytes=100, agent_key_stride=STRIDE)
    t.fill(0, 0, 64 * 3)  # agent 0: blocks 0-2
    t.fill_keys([0 * STRIDE + 3, 0 * STRIDE + 4])  # its persisted blocks 3-4: one run 0-4
    assert t.runs == {0: {0: 5}} and t.held_tokens(0, 0, 64 * 6, False) == 64 * 5
    assert t.held_tokens(0, 100, 200, False) == 100  # any token range, counted by the blocks held
    t.fill(1, 0, 64 * 4 + 1)  # agent 1: 4 full blocks and one token: 5 blocks (a Full Block is read whole)
    assert t.runs[1] == {0: 5} and t.lru.used_bytes == 1000
    assert t.held_tokens(0, 0, 64, True) == 64  # agent 0's run used now: agent 1's is the oldest
    t.fill(2, 0, 64)
    assert 1 not in t.runs and t.held_tokens(1, 0, 320, False) == 0 and t.held_tokens(0, 0, 320, False) == 320
    t.check_invariants()
    t.fill(3, 0, 64 * 11)  # larger than the tier: its last 10 blocks, as a block LRU filled in order keeps
    assert t.runs == {3: {1: 11}} and t.lru.used_bytes == 1000
    t.check_invariants()
    t.runs[3][20] = 21  # a run the LRU does not have
    with pytest.raises(AssertionError):
        t.check_invariants()


def test_a_block_tier_holds_block_ids_shared_between_requests():
    blocks = [(10, 11, 12), (10, 11, 13)]  # two requests sharing a two-block prefix
    t = BlockTier(capacity_bytes=300, block_tokens=64, block_bytes=100, blocks=blocks)
    t.fill(0, 0, 192)
    assert t.held_tokens(1, 0, 192, True) == 128  # 10, 11: the shared prefix
    t.fill_keys([13, -1])  # a persisted block, and an unnamed one (never looked up)
    assert 12 not in t.lru and t.held_tokens(1, 0, 192, False) == 192  # 12 was the least recently used
    t.check_invariants()


@pytest.mark.parametrize("mode", ["basic+dram", "dualpath+dram", "dualpath+split+dram", "dualpath+selective+dram"])
def test_every_hit_byte_comes_from_storage_or_a_tier_once_and_every_ledger_holds(mode):
    sim, r = run(SPEC, mode=mode, cluster=paper_cluster("ds-27b", "2P2D"), check_every=1)
    kvb, b = sim.kv_bytes_per_token, r["bytes"]
    hits = sum(sim.recorder.hit_tokens) * kvb
    storage = b["storage_to_prefill"] + b["storage_via_decode"]
    dram = b["dram_to_prefill"] + b["dram_via_decode"]
    assert storage + dram == pytest.approx(hits) and dram > 0
    if mode.startswith("basic"):
        assert b["storage_via_decode"] == b["dram_via_decode"] == 0  # basic reads on the PE side only


def test_a_single_de_node_holds_every_later_hit_and_dualpath_reads_it_there():
    """1P1D: the one DE node persisted every block any later turn hits, so its tier (large enough)
    holds each hit whole: the rule picks the DE side every time and no hit byte crosses a SNIC."""
    sim, r = run(SPEC, mode="dualpath+dram", check_every=1)
    b = r["bytes"]
    assert b["storage_to_prefill"] == b["storage_via_decode"] == 0
    assert b["dram_via_decode"] == pytest.approx(sum(sim.recorder.hit_tokens) * sim.kv_bytes_per_token)
    assert b["dram_via_decode"] > 0
    rec = sim.recorder
    # a hit the tier holds whole waits for no SNIC and no buffer room: ready at its DE's choice
    assert all(read_s == 0 for read_s, hit in zip(rec.read_s, rec.hit_tokens) if hit)


def test_a_tier_of_no_capacity_is_dualpath_exactly():
    """With 0 GB the tier holds nothing: every cost adds the same hit on both sides, so each decision
    and each number is dualpath's (the tier and the rule change nothing they should not)."""
    cl = replace(paper_cluster("ds-27b", "2P2D"), dram_tier_gb_per_node=0.0)
    sim, r = run(SPEC, mode="dualpath+dram", cluster=cl, check_every=1)
    base, rb = run(SPEC, mode="dualpath", cluster=cl)
    assert r["bytes"]["dram_to_prefill"] == r["bytes"]["dram_via_decode"] == 0
    assert sim.recorder.read_side == base.recorder.read_side and sim.recorder.first_s == base.recorder.first_s
    assert r["jct_s"] == rb["jct_s"]


def test_the_tier_shortens_the_reads_and_the_ttft():
    """basic+dram: from its third turn an agent's PE node holds all of its hit but the blocks the last
    turn added (when the agent's turns land on the node that read its earlier ones: one PE node
    here), so its reads, queued behind the others' on one SNIC, shrink to a block or two."""
    cl = paper_cluster("ds-27b", "1P1D")
    spec = [[(20000, 20)] + [(500, 20)] * 5 for _ in range(8)]
    _, with_tier = run(spec, mode="basic+dram", cluster=cl)
    _, without = run(spec, mode="basic", cluster=cl)
    assert with_tier["ttft_breakdown_mean_s"]["read"] < 0.5 * without["ttft_breakdown_mean_s"]["read"]
    assert with_tier["ttft_s"]["p50"] < without["ttft_s"]["p50"]


def test_a_hit_the_tier_holds_whole_takes_no_buffer_room_at_its_read():
    """Such a read copies nothing into the node's buffer (the PE's layer loads and the DE path's
    streams take the blocks from the tier's memory): with a DE buffer of one and a half prompts, a
    later turn still reads at once instead of waiting for room held by prompts waiting for a PE,
    and its DE-buffer room is taken before its first forward, as a request with no hit takes it."""
    cl = paper_cluster("ds-27b", "1P1D")
    spec = [[(20000, 20)] + [(500, 20)] * 3 for _ in range(4)]
    kvb_prompt = 22000 * 21720  # the longest prompt's KV bytes (ds-27b: 21,720 bytes a token)
    tight = replace(cl, node=replace(cl.node, dram_buffer_bytes=int(1.5 * kvb_prompt)))
    sim, r = run(spec, mode="dualpath+dram", cluster=tight, check_every=1)
    rec = sim.recorder
    assert r["num_turns"] == 16
    assert all(read_s == 0 for read_s, hit in zip(rec.read_s, rec.hit_tokens) if hit)


@pytest.mark.parametrize("mode", ["dualpath", "dualpath+dram", "basic+dram"])
def test_the_decision_log_carries_what_the_read_side_rule_compared(mode):
    """Each decision's `pe_cost_tokens` and `de_cost_tokens` (metrics/decisions.py) are the rule's
    inputs: the side is the one the rule picks from them, with `+dram` a side whose tier holds the
    whole hit costs 0, and basic compares nothing (-1)."""
    from dualpath.config import SimConfig, WorkloadConfig
    from dualpath.core.policy import choose_read_side
    from dualpath.metrics.decisions import DecisionLog
    from dualpath.sim.simulator import Simulator
    from sim_helpers import trajs

    t = trajs(SPEC)
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "2P2D"), workload=WorkloadConfig(num_agents=len(t)))
    sim = Simulator(cfg, parse_mode(mode), t, [0.0] * len(t))
    sim.driver.decisions = DecisionLog()
    sim.run()
    log = sim.driver.decisions.decisions
    assert len(log) == sum(len(a) for a in SPEC)
    if mode.startswith("basic"):
        assert all(d.pe_cost_tokens == d.de_cost_tokens == -1 and d.side == "prefill" for d in log)
        return
    assert all(min(d.pe_cost_tokens, d.de_cost_tokens) >= 0 for d in log)
    assert all(d.side == ("prefill", "decode")[choose_read_side(d.pe_cost_tokens, d.de_cost_tokens)] for d in log)
    assert len({d.side for d in log}) == 2  # the costs differ from turn to turn: both sides chosen
    if mode.endswith("+dram"):
        assert any(d.hit_tokens and d.de_cost_tokens == 0 and d.side == "decode" for d in log)


def test_with_timed_persists_a_generated_block_enters_the_des_tier_when_its_step_ends(monkeypatch):
    """`+dram` with timed persists (the `local` preset's): each generated block goes into the DE node's
    tier when the decode step that filled it ends (sim/decode.py `block_filled`), as the runtime's DE
    copies it there, in order and before its turn ends; without them (the paper presets) the turn's
    blocks go in together at its end and no step hands one over."""
    from dualpath.sim.simulator import Simulator

    filled: list = []
    finished: dict = {}
    real, real_finished = Simulator.block_filled, Simulator.decode_finished

    def spy(self, req, index):
        filled.append((str(req.rid), index, self.loop.now_s))
        real(self, req, index)

    def spy_finished(self, req):
        finished[str(req.rid)] = self.loop.now_s
        real_finished(self, req)

    monkeypatch.setattr(Simulator, "block_filled", spy)
    monkeypatch.setattr(Simulator, "decode_finished", spy_finished)
    spec = [[(3000, 400), (200, 300), (100, 200)] for _ in range(2)]
    cl = paper_cluster("ds-27b", "1P1D")
    sim, r = run(spec, mode="dualpath+dram", cluster=replace(cl, persist_waits_for_snic_write=True), check_every=1)
    assert sim.writes.timed
    by_turn: dict = {}
    for rid, index, t in filled:
        by_turn.setdefault(rid, []).append((index, t))
    assert len(by_turn) == r["num_turns"] == 6
    for rid, blocks in by_turn.items():
        indices, times = [i for i, _ in blocks], [t for _, t in blocks]
        assert indices == sorted(indices) and times == sorted(times) and len(set(indices)) == len(indices)
        assert times[-1] <= finished[rid] and times[0] < finished[rid]  # during the turn, not at its end
    # the DE's tier holds every turn's generated blocks that it can hold, and the next turn reads them there
    assert r["bytes"]["dram_via_decode"] > 0
    first_blocks = [t for rid, blocks in by_turn.items() for i, t in blocks[:1]]
    assert min(first_blocks) < max(first_blocks)  # handed over through the run, not all at one moment
    filled.clear()
    run(spec, mode="dualpath+dram", cluster=cl)
    assert filled == []
