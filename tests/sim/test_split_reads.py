"""`dualpath+split` (core/policy/split.py) in the simulator: both parts of a split read cross their
nodes' SNICs, every ledger holds, the bytes are dualpath's, and the split pays off where the two
sides read at different rates. The runtime's half: tests/runtime/cluster/test_runtime_split_reads.py."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dualpath.config import RuntimeConfig, SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.core.lanes import Lane
from dualpath.errors import InputError
from dualpath.sim.runner import run_modes
from dualpath.sim.simulator import Simulator

from sim_helpers import run, trajs

SPEC = [[(4000 + 997 * i, 30), (300, 20), (100, 30), (500, 3)] for i in range(6)]


def _read_bytes(r: dict) -> float:
    return r["bytes"]["storage_to_prefill"] + r["bytes"]["storage_via_decode"]


def test_the_mode_parses_and_both_worlds_take_it():
    f = parse_mode("dualpath+split")
    assert f.split_reads and f.de_read_path and f.dualpath_scheduler and not f.io_free
    assert not parse_mode("dualpath").split_reads
    assert RuntimeConfig(mode="dualpath+split").features.split_reads  # the runtime's half: tests/runtime/cluster/test_runtime_split_reads.py
    assert replace(RuntimeConfig(), mode="dualpath+split").features.split_reads  # a mode switch of a running cluster
    with pytest.raises(InputError, match="unknown mode"):
        parse_mode("basic+split")


@pytest.mark.pure_only
@pytest.mark.parametrize("waits", [False, True])
def test_the_local_presets_placement_holds_both_parts_of_a_split_read(waits):
    """With host buffers taken at placement (the `local` preset, as the runtime's router does), a split
    read holds the whole prompt's slots on the DE node and its PE part's on the PE node; its read
    queues are charged part by part while it waits (every ledger checked at every event)."""
    cl = replace(paper_cluster("ds-27b", "1P2D"), prefill_snic_scale=0.5, buffers_at_placement=True,
                 persist_waits_for_snic_write=waits)
    cfg = SimConfig(cluster=cl, workload=WorkloadConfig(num_agents=len(SPEC)), check_invariants_every=1)
    sim = Simulator(cfg, parse_mode("dualpath+split"), trajs(SPEC), [0.0] * len(SPEC))
    taken, take = [], sim.gate._take_buffers

    def recording(req, pe_part):
        ok = take(req, pe_part)
        if ok and req.pe_part_tokens:
            taken.append((pe_part, req.pe_buffer_bytes, req.de_buffer_bytes, req.input_tokens))
        return ok

    sim.gate._take_buffers = recording
    r = sim.run()
    sim.check_invariants()
    slot = cl.block_tokens * sim.kv_bytes_per_token
    assert len(taken) >= 3 and r["scheduler"]["split_reads"] == len(taken)
    for pe_part, pe_bytes, de_bytes, prompt in taken:
        assert pe_bytes == math.ceil(pe_part / cl.block_tokens) * slot and 0 < pe_bytes < de_bytes
        assert de_bytes == math.ceil(prompt / cl.block_tokens) * slot
    _, dual = run(SPEC, mode="dualpath", cluster=cl)
    assert _read_bytes(r) == pytest.approx(sum(sim.recorder.hit_tokens) * sim.kv_bytes_per_token)
    assert r["bytes"]["storage_to_prefill"] > 0 and r["bytes"]["storage_via_decode"] > 0
    assert r["num_turns"] == dual["num_turns"]


@pytest.mark.pure_only
def test_split_reads_keep_every_ledger_and_move_dualpaths_bytes():
    cl = replace(paper_cluster("ds-27b", "1P2D"), prefill_snic_scale=0.5)
    cfg = SimConfig(cluster=cl, workload=WorkloadConfig(num_agents=len(SPEC)), check_invariants_every=10)
    sim = Simulator(cfg, parse_mode("dualpath+split"), trajs(SPEC), [0.0] * len(SPEC))
    passes = []
    schedule = sim.driver.scheduler.schedule
    sim.driver.scheduler.schedule = lambda view: passes.append(schedule(view)) or passes[-1]
    r = sim.run()
    _, dual = run(SPEC, mode="dualpath", cluster=cl)
    parts = [(d.pe_part_tokens, d.read_tokens) for p in passes for d in p.decode if d.pe_part_tokens]
    assert len(parts) >= 5 and all(0 < pe < hit and pe % 64 == 0 for pe, hit in parts)  # split, on block bounds
    assert r["scheduler"]["split_reads"] == len(parts) and "split_reads" not in dual["scheduler"]
    kv = sim.kv_bytes_per_token
    b = r["bytes"]
    assert _read_bytes(r) == pytest.approx(sum(sim.recorder.hit_tokens) * kv) == pytest.approx(_read_bytes(dual))
    assert b["storage_to_prefill"] > 0 and b["storage_via_decode"] > 0
    # every KV byte on a CNIC crosses two link directions: streams (both parts), PD transfer, DE H2D
    cnic_kv = sum(l.served_bytes[Lane.KV] for e in sim.engines_by_id.values() for l in (e.cnic_out, e.cnic_in))
    assert cnic_kv == pytest.approx(2 * (b["kv_layer_streams"] + b["pd_transfer"] + b["de_h2d"]))
    # the PD transfer carries the computed tokens and the PE side's hit bytes, once
    computed = sum(i - h for i, h in zip(sim.recorder.input_tokens, sim.recorder.hit_tokens)) * kv
    assert b["pd_transfer"] == pytest.approx(computed + b["storage_to_prefill"])


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=st.lists(st.lists(st.tuples(st.integers(1, 9000), st.integers(1, 60)), min_size=1, max_size=4), min_size=1, max_size=5),
    p=st.integers(1, 2),
    d=st.integers(1, 2),
    scale=st.sampled_from([0.25, 0.5, 1.0]),
    stagger=st.floats(0.0, 5.0),
)
def test_random_small_workloads_finish_with_ledgers_intact(spec, p, d, scale, stagger):
    cl = replace(paper_cluster("ds-27b", f"{p}P{d}D"), prefill_snic_scale=scale)
    arrivals = [i * stagger for i in range(len(spec))]
    sim, r = run(spec, mode="dualpath+split", cluster=cl, arrivals=arrivals, check_every=25)
    assert r["num_turns"] == sum(len(t) for t in spec) and not sim.inflight
    for n in sim.nodes:
        assert n.buffer_free_bytes == pytest.approx(n.buffer_total_bytes)
        assert n.read_queue_tokens == 0 and not n.read_queue
    assert math.isfinite(r["jct_s"])


def _pair(pd: str, agents: int, max_len: int, scale: float) -> tuple[dict, dict]:
    cl = replace(paper_cluster("ds-27b", pd), prefill_snic_scale=scale)
    cfg = SimConfig(cluster=cl, workload=WorkloadConfig(max_len_tokens=max_len, num_agents=agents, seed=3))
    dual, split = run_modes(cfg, ["dualpath", "dualpath+split"])["runs"]
    assert _read_bytes(split) == pytest.approx(_read_bytes(dual), rel=1e-12)  # the same hits, read once
    return dual, split


def test_split_reads_pay_off_where_the_pe_side_reads_at_half_rate():
    """2P1D, the PE nodes' SNICs at half the DE node's: dualpath balances queued tokens, not seconds,
    so the PE side lags; the split cuts each hit by the two sides' rates."""
    dual, split = _pair("2P1D", 32, 65536, 0.5)
    assert split["jct_s"] < dual["jct_s"] or split["ttft_s"]["p99"] < dual["ttft_s"]["p99"]
    assert split["ttft_s"]["p99"] < 0.9 * dual["ttft_s"]["p99"]
    assert split["bytes"]["storage_to_prefill"] < dual["bytes"]["storage_to_prefill"]  # less on the slower side


def test_split_reads_cost_nothing_on_a_balanced_cluster():
    dual, split = _pair("1P1D", 32, 32768, 1.0)
    assert split["jct_s"] <= 1.01 * dual["jct_s"]


def test_with_agents_that_wait_dualpath_reads_on_the_slow_side_and_a_split_halves_the_wait():
    """Agents arriving online and waiting for tools (experiments/beyond.py `waiting_points`): the
    read queues are mostly empty when a request is placed, an empty queue on both sides is a tie,
    and the read-side rule gives a tie to the PE node, whose SNIC here reads at half rate. So
    dualpath reads nearly every hit on the slow side; a split reads on both, and the median TTFT
    falls while the JCT, set by the agents' own chains, stays."""
    cl = replace(paper_cluster("ds-27b", "2P1D"), prefill_snic_scale=0.5)
    work = WorkloadConfig(max_len_tokens=65536, num_agents=32, seed=3, arrival_aps=1.0, tool_time_median_s=5.0)
    dual, split = run_modes(SimConfig(cluster=cl, workload=work), ["dualpath", "dualpath+split"])["runs"]
    assert _read_bytes(split) == pytest.approx(_read_bytes(dual), rel=1e-12)
    assert dual["bytes"]["storage_to_prefill"] > 0.95 * _read_bytes(dual)  # the ties, on the half-rate side
    assert split["bytes"]["storage_via_decode"] > 0.5 * _read_bytes(split)  # the faster side reads the larger part
    assert split["ttft_s"]["p50"] < 0.8 * dual["ttft_s"]["p50"]
    assert split["ttft_s"]["p99"] < dual["ttft_s"]["p99"]
    assert split["jct_s"] <= 1.01 * dual["jct_s"]
