"""EP dispatch/combine on the CNICs' latency-critical lane (sim/ep_comm.py): the bytes from the model
shape, the rate a burst gets with two classes or one, the KV lane's loss to the bursts, and what a
whole simulation shows: one FIFO class slows decode under a KV flood, the two classes do not."""

from __future__ import annotations


import pytest

from dualpath.bench.lanes_sim import run_lanes_sim
from dualpath.config import SimConfig, WorkloadConfig, paper_cluster
from dualpath.costmodel.ep_traffic import MOE_SHAPES, decode_bytes_per_token, prefill_bytes_per_token
from dualpath.core.lanes import Lane, LaneWeights
from dualpath.sim.ep_comm import EpComm
from dualpath.sim.events import EventLoop
from dualpath.sim.links import Link, Network

CAP = 50e9  # bytes/s, one CX7 direction (docs/hardware.md §1.2)


def test_bytes_per_token_follow_the_model_shape():
    v32 = MOE_SHAPES["ds-v3.2-660b"]
    per_copy = (7168 + 7168 // 128 * 4) + 2 * 7168  # FP8 + scales dispatch, BF16 combine
    assert decode_bytes_per_token(v32, 4) == pytest.approx(58 * 8 * 3 / 4 * per_copy)
    assert prefill_bytes_per_token(v32, 2) == pytest.approx(58 * 1 * (1 - 0.5 ** 8) * per_copy)
    assert decode_bytes_per_token(v32, 1) == prefill_bytes_per_token(v32, 1) == 0  # NVLink only
    # more nodes: more of a token's experts are remote, never more than top-k copies per layer
    d = [decode_bytes_per_token(v32, n) for n in (2, 4, 8, 64)]
    assert d == sorted(d) and d[-1] < 58 * 8 * per_copy


def _link(one_class=False, flood=False):
    return Link("cnic", CAP, LaneWeights(one_class=one_class), kv_flood=flood)


def test_a_burst_gets_99_percent_with_two_classes_and_one_flow_share_with_one():
    loop = EventLoop()
    net = Network(loop)
    two, one = _link(), _link(one_class=True)
    assert two.lc_burst_rate() == one.lc_burst_rate() == CAP  # an idle link is all the burst's
    for link in (two, one):
        for _ in range(3):
            net.start(1e12, Lane.KV, (link,), lambda f: None)
    assert two.lc_burst_rate() == pytest.approx(CAP * 0.99)
    assert one.lc_burst_rate() == pytest.approx(CAP / 4)
    flooded = _link(one_class=True, flood=True)
    assert flooded.lc_burst_rate() == pytest.approx(CAP / 2)  # the flood is one more KV flow
    assert flooded.share(Lane.KV) == CAP  # (it has no flow object: a real KV flow gets CAP / 2)
    net.start(1e12, Lane.KV, (flooded,), lambda f: None)
    assert flooded.share(Lane.KV) == pytest.approx(CAP / 2)


def test_the_bursts_mean_rate_is_taken_from_the_kv_lane_but_never_all_of_it():
    loop = EventLoop()
    net = Network(loop)
    link = _link()
    f = net.start(1e12, Lane.KV, (link,), lambda f: None)
    net.reserve_lc(link, 0.4 * CAP)
    assert f.rate == pytest.approx(0.6 * CAP)
    net.reserve_lc(link, CAP)
    assert f.rate == pytest.approx(0.01 * CAP)  # weighted round robin: the KV class never starves
    net.reserve_lc(link, 0.0)
    assert f.rate == CAP


def test_a_step_is_retimed_when_kv_flows_come_and_go():
    loop = EventLoop()
    net = Network(loop)
    out, inn = _link(one_class=True), _link(one_class=True)
    ep = EpComm(net, [(out, inn)], bytes_per_token=1e6, ignores_kv=False)
    seen = []
    ep.watch(lambda gpu: seen.append(ep.gpu_changed(gpu, 10)))
    assert ep.extra_s([10]) == 0  # unloaded: the fixed EP latency already counts it
    net.start(CAP * 1e-3, Lane.KV, (out,), lambda f: None)  # 1 ms of KV at full rate
    assert seen[-1] == pytest.approx(10e6 / (CAP / 2) - 10e6 / CAP)  # half the link: twice as long
    loop.run()
    assert seen[-1] == 0 and len(seen) == 2
    ep.book([10], 3.0)
    assert out.served_bytes[Lane.LATENCY_CRITICAL] == inn.served_bytes[Lane.LATENCY_CRITICAL] == 30e6


def test_one_fifo_class_slows_decode_under_a_kv_flood_and_two_classes_do_not():
    """A small DS 660B 2P4D run, six ways (bench/lanes_sim.py). The orderings and the EP bytes are
    asserted, not values: the bytes are the workload's (identical in every case), the times are
    what the lanes make of them."""
    base = SimConfig(cluster=paper_cluster("ds-v3.2-660b", "2P4D"),
                     workload=WorkloadConfig(max_len_tokens=16384, num_agents=64, seed=3))
    r = run_lanes_sim(base)
    flood = r["kv"]["flood"]
    assert flood["two_classes"]["tpot_over_reference"] <= 1.01
    assert flood["one_class"]["tpot_over_reference"] > flood["two_classes"]["tpot_over_reference"]
    assert flood["one_class"]["tpot_over_reference"] > 1.01
    lc = {row["cnic_lane_latency_critical_bytes"] for rows in r["kv"].values() for row in rows.values()}
    assert max(lc) == pytest.approx(min(lc), rel=1e-9) and min(lc) > 0
