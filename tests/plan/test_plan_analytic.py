"""The planner's estimates: each resource's busy seconds follow the cost model and the shape, and
the binding resource moves where the numbers say it should."""

import pytest

from dualpath.config import paper_cluster
from dualpath.plan import analytic
from dualpath.plan.space import Shape
from dualpath.plan.workload import Generated
from dualpath.workloads import generate


@pytest.fixture(scope="module")
def demand_heavy():
    return _demand(512)


def _demand(agents):
    return analytic.demand(Generated(32768, agents, 3).rows(64)[0], "ds-27b")


def _shape(p, d):
    return Shape(p, d, p, d)


def test_the_demand_is_the_workloads_own_sum(demand_heavy):
    trajs = generate(32768, 512, 3)
    assert demand_heavy.num_turns == sum(t.num_turns for t in trajs)
    assert demand_heavy.gen_tokens == sum(turn.gen_tokens for t in trajs for turn in t.turns)
    prompts = sum(t.input_tokens(i) for t in trajs for i in range(t.num_turns))
    assert demand_heavy.hit_tokens + demand_heavy.miss_tokens == prompts
    assert demand_heavy.hit_tokens % 64 == 0 and demand_heavy.hit_tokens > 10 * demand_heavy.miss_tokens


def test_storage_time_is_hit_bytes_over_the_snics_each_policy_can_use(demand_heavy):
    node = paper_cluster("ds-27b").node
    hit_bytes = demand_heavy.hit_tokens * paper_cluster("ds-27b").model_spec.kv_bytes_per_token
    basic = analytic.estimate(demand_heavy, "ds-27b", _shape(2, 6), "basic")
    dual = analytic.estimate(demand_heavy, "ds-27b", _shape(2, 6), "dualpath")
    assert basic.busy_s["PE SNIC"] == pytest.approx(hit_bytes / (2 * node.snic_read_bytes_per_s))
    assert dual.busy_s["PE+DE SNIC"] == pytest.approx(hit_bytes / (8 * node.snic_read_bytes_per_s))
    assert basic.busy_s["compute (PE)"] == dual.busy_s["compute (PE)"]


def test_more_prefill_nodes_cut_prefill_time_and_add_decode_time(demand_heavy):
    few = analytic.estimate(demand_heavy, "ds-27b", _shape(1, 7), "basic")
    many = analytic.estimate(demand_heavy, "ds-27b", _shape(7, 1), "basic")
    decode = lambda e: e.busy_s.get("compute (DE)", e.busy_s.get("DE HBM"))  # noqa: E731
    assert many.busy_s["compute (PE)"] < few.busy_s["compute (PE)"] / 3
    # offline, a DE node's steps are its agents' tokens over its batch (its agents): as many on one
    # node as on seven, each seven times the attention
    assert decode(many) > decode(few)
    assert few.busy_s["PE SNIC"] == pytest.approx(7 * many.busy_s["PE SNIC"])
    assert few.binding == "PE SNIC" and many.binding != "PE SNIC"


def test_a_few_agents_on_many_nodes_are_bound_by_their_own_chain_of_turns():
    light = _demand(4)
    e = analytic.estimate(light, "ds-27b", _shape(4, 4), "dualpath")
    assert e.binding == "agent chain" and e.jct_s == e.busy_s["agent chain"]
    assert e.out_of_range is None


def test_outside_the_bottleneck_free_range_only_the_de_read_modes_are_marked():
    d = _demand(16)
    assert analytic.estimate(d, "ds-27b", _shape(1, 8), "dualpath").out_of_range == "PE CNIC"  # 1/8 < 1/7
    assert analytic.estimate(d, "ds-27b", _shape(8, 2), "dualpath+split").binding == "DE CNIC"  # 4 > 3.5
    assert analytic.estimate(d, "ds-27b", _shape(8, 2), "basic").out_of_range is None


def test_tool_time_lengthens_the_agent_chain_by_each_agents_waits_and_reaches_the_simulations():
    from dualpath.workloads.tool_time import with_tool_times

    timed_wl = Generated(32768, 64, 3, tool_time_s=4.0)
    timed, plain = analytic.demand(timed_wl.rows(64)[0], "ds-27b"), _demand(64)
    waits = [sum(t.wait_s for t in a.turns) for a in with_tool_times(generate(32768, 64, 3), 4.0, 1.0, 3)]
    assert list(timed.agent_wait_s) == pytest.approx(waits)
    assert not plain.agent_wait_s.any()
    a, b = (analytic.estimate(d, "ds-27b", _shape(1, 1), "dualpath").busy_s["agent chain"] for d in (timed, plain))
    assert max(waits) <= a - b + 1e-6 and a - b <= max(waits) + b
    shape = Shape(2, 2, 1, 1)
    assert timed_wl.unit_spec("ds-27b", shape, "dualpath").tool_time_s == 4.0
    assert " --tool-time 4 " in timed_wl.sim_flags(shape, unit=True) + " "
