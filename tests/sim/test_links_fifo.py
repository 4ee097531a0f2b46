"""FIFO links (the `local` preset's model of the runtime's LinkArbiter) against closed forms: one
flow of a lane at a time in start order, the lanes still weighted, and the ledger exact."""

import pytest

from dualpath.core.lanes import Lane, LaneWeights
from dualpath.sim.events import EventLoop
from dualpath.sim.links import Link, Network

GBPS = 1e9


def setup(weights=LaneWeights(), fifo=True):
    loop = EventLoop()
    return loop, Network(loop), Link("arbiter", 10 * GBPS, weights, fifo=fifo)


def _finish_times(fifo: bool) -> dict[str, float]:
    # a: 2 GB and b: 1 GB at t=0, c: 1 GB at t=0.1, all on one 10 GB/s link
    loop, net, link = setup(fifo=fifo)
    done: dict[str, float] = {}
    net.start(2 * GBPS, Lane.KV, (link,), lambda f: done.__setitem__("a", loop.now_s))
    net.start(1 * GBPS, Lane.KV, (link,), lambda f: done.__setitem__("b", loop.now_s))
    loop.call_at(0.1, lambda _: net.start(1 * GBPS, Lane.KV, (link,), lambda f: done.__setitem__("c", loop.now_s)))
    loop.run()
    net.check_invariants([link])
    assert link.served_bytes[Lane.KV] == pytest.approx(4 * GBPS)
    return done


def test_fifo_serves_one_flow_at_a_time_in_start_order():
    done = _finish_times(fifo=True)
    assert done == {"a": pytest.approx(0.2), "b": pytest.approx(0.3), "c": pytest.approx(0.4)}


def test_the_same_flows_shared_finish_otherwise():
    # processor sharing: a and b at 5 GB/s until 0.1, then three at 3.33 GB/s: b (0.5 GB left)
    # at 0.25, then a and c (1.0 and 0.5 GB left) at 5 GB/s: c at 0.35, a at 0.4
    done = _finish_times(fifo=False)
    assert done == {"b": pytest.approx(0.25), "c": pytest.approx(0.35), "a": pytest.approx(0.4)}


def test_fifo_heads_of_two_lanes_split_the_link_by_the_lane_weights():
    loop, net, link = setup()
    done: dict[str, float] = {}
    net.start(1000 * GBPS, Lane.KV, (link,), lambda f: done.__setitem__("kv", loop.now_s))
    net.start(0.99 * GBPS, Lane.LATENCY_CRITICAL, (link,), lambda f: done.__setitem__("lc1", loop.now_s))
    net.start(0.99 * GBPS, Lane.LATENCY_CRITICAL, (link,), lambda f: done.__setitem__("lc2", loop.now_s))
    loop.run(until_s=1.0)
    # the latency-critical head gets 99% (9.9 GB/s): lc1 by 0.1 s, lc2 behind it by 0.2 s
    assert done == {"lc1": pytest.approx(0.1), "lc2": pytest.approx(0.2)}
    net.settle(link)
    assert link.served_bytes[Lane.KV] == pytest.approx(0.2 * 0.1 * GBPS + 0.8 * 10 * GBPS)


def test_one_class_fifo_is_one_queue_for_both_lanes():
    loop, net, link = setup(weights=LaneWeights(one_class=True))
    done: dict[str, float] = {}
    net.start(1 * GBPS, Lane.KV, (link,), lambda f: done.__setitem__("kv", loop.now_s))
    net.start(1 * GBPS, Lane.LATENCY_CRITICAL, (link,), lambda f: done.__setitem__("lc", loop.now_s))
    loop.run()
    assert done == {"kv": pytest.approx(0.1), "lc": pytest.approx(0.2)}  # the burst waits its turn


def test_a_flow_listing_one_fifo_link_twice_crosses_it_once():
    loop, net, link = setup()
    done = []
    net.start(1 * GBPS, Lane.KV, (link, link), lambda f: done.append(loop.now_s))
    loop.run()
    assert done == [pytest.approx(0.1)]
    assert link.served_bytes[Lane.KV] == pytest.approx(1 * GBPS)


def test_bad_fifo_setups_are_refused():
    loop, net, a = setup()
    b = Link("other", 10 * GBPS, LaneWeights(), fifo=True)
    with pytest.raises(ValueError, match="at most one FIFO link"):
        net.start(1 * GBPS, Lane.KV, (a, b), lambda f: None)
    with pytest.raises(ValueError, match="KV flood"):
        Link("flooded", 10 * GBPS, LaneWeights(), kv_flood=True, fifo=True)
