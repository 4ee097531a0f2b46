"""Algorithm 1 at an offline start (docs/paper.md §3.2): the first PE group to fetch takes FIFO
requests until each of its engines is over beta, and beta counts tokens (a cached token as much as
a computed one), so when every agent's first turn arrives at t = 0 and the burst fits under one
group's caps, that group takes all of it. This is why a deployment's TTFT p99 at an offline start
grows with its number of PE groups, and why `dualpath plan`'s unit simulation (one group, 1/k of
the burst) predicts it low (docs/results.md, "Planning a cluster"). `+tail` (core/policy/tail.py)
spreads the burst over the PE groups, and the deployment's first turns come as fast as a unit's."""

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.sim.runner import load_trajectories
from dualpath.sim.simulator import Simulator


def _first_turns(pd, agents, mode="dualpath"):
    cfg = SimConfig(cluster=paper_cluster("ds-27b", pd, ep_group_prefill_nodes=1, ep_group_decode_nodes=1),
                    workload=WorkloadConfig(max_len_tokens=32768, num_agents=agents, seed=1))
    trajs, arrivals = load_trajectories(cfg)
    sim = Simulator(cfg, parse_mode(mode), trajs, arrivals)
    sim.run()
    rec = sim.recorder
    gpus = cfg.cluster.node.gpus_per_node
    rows = [(pe // gpus, first - arr) for turn, pe, first, arr in zip(rec.turn, rec.pe_engine, rec.first_s, rec.arrival_s)
            if turn == 0]
    later_nodes = {pe // gpus for turn, pe in zip(rec.turn, rec.pe_engine) if turn > 0}
    return rows, later_nodes


def test_the_offline_start_burst_lands_on_the_first_pe_group_to_fetch():
    whole, later = _first_turns("4P4D", 128)
    unit, _ = _first_turns("1P1D", 32)
    assert {node for node, _ in whole} == {0}  # every first turn on PE node 0
    assert later == {0, 1, 2, 3}  # afterwards every PE group gets work
    slowest = lambda rows: max(t for _, t in rows)  # noqa: E731
    assert slowest(whole) > 2 * slowest(unit)  # four units' bursts on one node against one unit's


def test_tail_spreads_the_offline_start_burst_over_every_pe_group():
    whole, _ = _first_turns("4P4D", 128, "dualpath+tail")
    unit, _ = _first_turns("1P1D", 32, "dualpath+tail")
    per_node = [sum(1 for node, _ in whole if node == n) for n in range(4)]
    assert per_node == [32, 32, 32, 32]
    slowest = lambda rows: max(t for _, t in rows)  # noqa: E731
    assert slowest(whole) < 1.25 * slowest(unit)
