"""Link model against closed forms (processor sharing with lane weights)."""

import pytest

from dualpath.core.lanes import Lane, LaneWeights
from dualpath.sim.events import EventLoop
from dualpath.sim.links import Link, Network

GBPS = 1e9


def setup(cap=10 * GBPS, weights=LaneWeights()):
    loop = EventLoop()
    return loop, Network(loop), Link("l", cap, weights)


def test_one_flow_runs_at_capacity():
    loop, net, link = setup()
    done = []
    net.start(5 * GBPS, Lane.KV, (link,), lambda f: done.append(loop.now_s))
    loop.run()
    assert done == [pytest.approx(0.5)]
    assert link.served_bytes[Lane.KV] == pytest.approx(5 * GBPS)


def test_n_equal_flows_share_equally_and_finish_together():
    loop, net, link = setup()
    done = []
    for _ in range(4):
        net.start(1 * GBPS, Lane.KV, (link,), lambda f: done.append(loop.now_s))
    loop.run()
    assert done == [pytest.approx(0.4)] * 4  # 4 GB at 10 GB/s


def test_a_late_flow_slows_the_first_then_frees_capacity():
    # f1: 10 GB from t=0; f2: 2 GB from t=0.5. Until 0.5 f1 moves 5 GB; then both at 5 GB/s:
    # f2 needs 0.4 s (done t=0.9), f1 has 3 GB left at 0.9 then runs alone: done 0.9 + 0.3 = 1.2
    loop, net, link = setup()
    done = {}
    net.start(10 * GBPS, Lane.KV, (link,), lambda f: done.__setitem__("f1", loop.now_s))
    loop.call_at(0.5, lambda _: net.start(2 * GBPS, Lane.KV, (link,), lambda f: done.__setitem__("f2", loop.now_s)))
    loop.run()
    assert done["f2"] == pytest.approx(0.9)
    assert done["f1"] == pytest.approx(1.2)


def test_two_backlogged_lanes_split_99_to_1():
    loop, net, link = setup()
    net.start(1000 * GBPS, Lane.LATENCY_CRITICAL, (link,), lambda f: None)
    net.start(1000 * GBPS, Lane.KV, (link,), lambda f: None)
    loop.run(until_s=2.0)
    net.settle(link)
    total = sum(link.served_bytes)
    assert total == pytest.approx(20 * GBPS)
    assert link.served_bytes[Lane.LATENCY_CRITICAL] / total == pytest.approx(0.99, rel=0.01)
    assert link.served_bytes[Lane.KV] / total == pytest.approx(0.01, rel=0.01)


def test_idle_latency_critical_lane_leaves_the_link_to_kv():
    loop, net, link = setup()
    done = []
    # a burst of LC traffic for 0.1 s, then idle: KV must run at 1% during it and 100% after
    net.start(1 * GBPS * 0.99, Lane.LATENCY_CRITICAL, (link,), lambda f: done.append(("lc", loop.now_s)))
    net.start(2 * GBPS, Lane.KV, (link,), lambda f: done.append(("kv", loop.now_s)))
    loop.run()
    lc_end = dict(done)["lc"]
    kv_end = dict(done)["kv"]
    assert lc_end == pytest.approx(0.1)
    # KV moved 0.1 * 0.1 GB = 0.01 GB during the burst, the remaining 1.99 GB at 10 GB/s
    assert kv_end == pytest.approx(0.1 + 1.99 / 10)


def test_multi_link_flow_runs_at_its_smallest_share():
    loop, net, a = setup(cap=10 * GBPS)
    b = Link("b", 4 * GBPS, LaneWeights())
    done = []
    net.start(4 * GBPS, Lane.KV, (a, b), lambda f: done.append(loop.now_s))
    loop.run()
    assert done == [pytest.approx(1.0)]
    assert a.served_bytes[Lane.KV] == pytest.approx(4 * GBPS) and b.served_bytes[Lane.KV] == pytest.approx(4 * GBPS)


def test_ledger_invariants_hold_mid_flight():
    loop, net, link = setup()
    for k in range(5):
        net.start((k + 1) * GBPS, Lane.KV, (link,), lambda f: None)
    loop.run(until_s=0.3)
    net.check_invariants([link])
    loop.run()
    net.check_invariants([link])
    assert net.num_active == 0
    assert net.completed_bytes[Lane.KV] == pytest.approx(15 * GBPS)
    assert link.served_bytes[Lane.KV] == pytest.approx(15 * GBPS)


def test_lane_weights_reject_zero():
    with pytest.raises(ValueError):
        LaneWeights(latency_critical=99, kv=0)
