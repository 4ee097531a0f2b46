"""End-to-end behaviour of the simulator on small, hand-built workloads."""

import gc
import json
import math

import pytest

from dualpath.costmodel.ep_traffic import MOE_SHAPES, decode_bytes_per_token
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.core.lanes import Lane
from dualpath.errors import InputError
from dualpath.sim.runner import _clean, load_trajectories
from dualpath.sim.simulator import Simulator

from sim_helpers import run

TWO_AGENTS = [[(3000, 40), (200, 30), (150, 20)], [(5000, 10), (64, 64)]]


def _strip(result):
    """The result as the JSON file holds it, minus the wall-clock fields."""
    kept = {k: v for k, v in result.items() if k not in ("wall_s", "turns_per_wall_s", "policy_wall_s")}
    return json.dumps(_clean(kept), sort_keys=True)


def test_same_input_same_result():
    _, a = run(TWO_AGENTS)
    _, b = run(TWO_AGENTS)
    assert _strip(a) == _strip(b)


@pytest.mark.parametrize("mode", ["basic", "dualpath+split+dram", "dualpath+selective+tail"])
def test_a_run_turns_the_collector_off_and_leaves_no_cycles_to_collect(mode):
    """`Simulator.run` keeps the cyclic collector off while it runs (and on again after): safe only
    while the run's objects die by their reference counts, which a full collection after it checks."""
    from dualpath.sim.runner import TraceReplay, load_workload

    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P2D"), workload=WorkloadConfig(max_len_tokens=32768, num_agents=64, seed=3))
    work = load_workload(cfg, TraceReplay())
    sim = Simulator(cfg, parse_mode(mode), work.agents, work.arrivals_s)
    gc.collect()
    enabled_during = []
    r = sim.run(progress=lambda done, total: enabled_during.append(gc.isenabled()))
    assert enabled_during and not any(enabled_during) and gc.isenabled()
    assert r["num_turns"] > 3000 and gc.collect() < 30  # 0 found in every mode here


def test_every_turn_finishes_with_consistent_timestamps():
    sim, r = run(TWO_AGENTS)
    rec = sim.recorder
    assert r["num_turns"] == 5
    for arrival, first, second, finish, gen in zip(rec.arrival_s, rec.first_s, rec.second_s, rec.finish_s, rec.gen_tokens):
        assert arrival <= first <= second <= finish
        if gen >= 3:
            assert finish > second
    # turn i+1 of an agent arrives exactly when turn i finishes (zero tool and think time)
    rows = {(a, t): (arr, fin) for a, t, arr, fin in zip(rec.agent, rec.turn, rec.arrival_s, rec.finish_s)}
    for (a, t), (arr, _) in rows.items():
        if t > 0:
            assert arr == rows[(a, t - 1)][1]
    assert r["jct_s"] == pytest.approx(max(a.finish_s for a in sim.agents))


def test_hits_are_the_block_aligned_previous_context():
    sim, _ = run([[(3000, 40), (200, 30), (150, 20)]])
    rec = sim.recorder
    # turn 0: nothing stored; turn 1: context 3040 -> 47 blocks = 3008 tokens; turn 2: 3270 -> 3264
    assert rec.hit_tokens == [0, 3008, 3264]
    assert rec.input_tokens == [3000, 3240, 3420]


@pytest.mark.parametrize("mode", ["basic", "dualpath", "oracle", "basic+layerwise", "basic+de_read", "basic+scheduler"])
def test_bytes_are_conserved_per_path_and_lane(mode):
    spec = [[(4000 + 997 * i, 30), (300, 20), (100, 30), (500, 3)] for i in range(6)]
    sim, r = run(spec, mode=mode, cluster=paper_cluster("ds-27b", "1P2D"), check_every=40)
    kv = sim.kv_bytes_per_token
    rec = sim.recorder
    by_side = [0, 0]
    for hit, side in zip(rec.hit_tokens, rec.read_side):
        by_side[side] += hit * kv
    b = r["bytes"]
    if mode == "oracle":
        assert b["storage_to_prefill"] == b["storage_via_decode"] == b["persisted"] == 0
        assert b["cnic_lane_kv"] == 0
        return
    assert b["storage_to_prefill"] == pytest.approx(by_side[0])
    assert b["storage_via_decode"] == pytest.approx(by_side[1])
    if "de_read" not in mode and mode != "dualpath":
        assert b["storage_via_decode"] == 0
    # every KV byte on a CNIC crosses exactly two link directions (loopback out+in, or out at
    # the sender and in at the receiver): streams, PD transfer and DE H2D, nothing else
    cnic_kv = sum(l.served_bytes[Lane.KV] for e in sim.engines_by_id.values() for l in (e.cnic_out, e.cnic_in))
    assert cnic_kv == pytest.approx(2 * (b["kv_layer_streams"] + b["pd_transfer"] + b["de_h2d"]))
    # every prompt reaches its DE whole, exactly once: H2D moves each prompt's KV once
    assert b["de_h2d"] == pytest.approx(sum(i * kv for i, g in zip(rec.input_tokens, rec.gen_tokens) if g >= 2))
    # persisted bytes = all full blocks of every agent's final context
    blocks = sum((sum(a + g for a, g in turns) // 64) for turns in spec)
    assert b["persisted"] == pytest.approx(blocks * 64 * kv)
    # the latency-critical lane carries the decode nodes' EP all-to-all (2 decode nodes: EP across
    # them; 1 prefill node: NVLink only), per direction: every decode step of every request
    steps = sum(g - 1 for g in rec.gen_tokens if g >= 2)
    assert b["cnic_lane_latency_critical"] == pytest.approx(steps * decode_bytes_per_token(MOE_SHAPES["ds-27b"], 2))


@pytest.fixture(scope="module")
def ds27b_storage_bound():
    """DS 27B on 1P1D with 256 generated 64K agents: the paper's storage-bound setting (Fig. 8)."""
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"), workload=WorkloadConfig(max_len_tokens=65536, num_agents=256, seed=5))
    trajs, arrivals = load_trajectories(cfg)
    return {m: Simulator(cfg, parse_mode(m), trajs, arrivals).run() for m in ("oracle", "dualpath", "basic")}


def test_oracle_le_dualpath_le_basic_when_storage_bound(ds27b_storage_bound):
    jct = {m: r["jct_s"] for m, r in ds27b_storage_bound.items()}
    assert jct["oracle"] <= jct["dualpath"] <= jct["basic"]
    assert jct["basic"] / jct["dualpath"] > 1.08


def test_dualpath_reads_on_both_sides_and_balances_snics(ds27b_storage_bound):
    basic, dual = ds27b_storage_bound["basic"], ds27b_storage_bound["dualpath"]
    read = dual["bytes"]["storage_to_prefill"] + dual["bytes"]["storage_via_decode"]
    assert dual["bytes"]["storage_via_decode"] > 0.3 * read
    # basic reads only at the PE node: the DE node's SNIC idles (1P1D: Max/Avg = 2)
    assert basic["snic_max_over_avg"] == pytest.approx(2.0, rel=0.01)
    assert dual["snic_max_over_avg"] < 1.3
    assert read == pytest.approx(basic["bytes"]["storage_to_prefill"], rel=1e-9)  # same hits either way


def test_a_prompt_longer_than_the_quota_is_chunked():
    # Qwen2.5-32B dense attention: a 20K-token first prompt costs ~0.4 s of attention > 0.3 s
    sim, r = run([[(20000, 5)]], cluster=paper_cluster("qwen2.5-32b", "1P1D"))
    assert r["prefill_forwards"] >= 2
    assert sim.recorder.hit_tokens == [0]


def test_trajectory_longer_than_de_hbm_is_rejected_with_a_clear_message():
    with pytest.raises(InputError, match="does not fit one DE"):
        run([[(60000, 10)]], cluster=paper_cluster("qwen2.5-32b", "1P1D"))


def test_first_round_must_send_tokens():
    with pytest.raises(InputError, match="at least one token"):
        run([[(0, 10)]])


def test_online_arrivals_are_respected():
    sim, r = run([[(1000, 5)], [(1000, 5)]], arrivals=[0.0, 100.0])
    assert min(sim.recorder.arrival_s) == 0.0 and max(sim.recorder.arrival_s) == 100.0
    assert r["jct_s"] > 100.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.lists(st.lists(st.tuples(st.integers(1, 9000), st.integers(1, 60)), min_size=1, max_size=4), min_size=1, max_size=5),
    p=st.integers(1, 2),
    d=st.integers(1, 2),
    mode=st.sampled_from(["basic", "dualpath", "oracle", "basic+layerwise+de_read"]),
    stagger=st.floats(0.0, 5.0),
)
def test_random_small_workloads_finish_with_ledgers_intact(spec, p, d, mode, stagger):
    arrivals = [i * stagger for i in range(len(spec))]
    sim, r = run(spec, mode=mode, cluster=paper_cluster("ds-27b", f"{p}P{d}D"), arrivals=arrivals, check_every=25)
    assert r["num_turns"] == sum(len(t) for t in spec)
    assert not sim.inflight
    for e in sim.engines_by_id.values():
        assert e.num_seqs == 0 and e.num_tokens == 0
        assert e.hbm_free_bytes == pytest.approx(e.hbm_total_bytes)
    for n in sim.nodes:
        assert n.buffer_free_bytes == pytest.approx(n.buffer_total_bytes)
        assert n.read_queue_tokens == 0
    assert math.isfinite(r["jct_s"])
