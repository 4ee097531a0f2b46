"""Expert-parallel groups smaller than a role (ClusterConfig.ep_group_*_nodes): a deployment of k
units, each role of each unit one EP group, steps as one unit does: the same weight shards, HBM for
KV and EP traffic over the CNICs, so the same TPOT; one group spanning the role does not."""

import pytest

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.errors import InputError
from dualpath.sim.compute_measured import compute_for
from dualpath.sim.runner import load_trajectories
from dualpath.sim.simulator import Simulator


def test_a_group_is_at_most_its_role_and_shards_the_weights_over_itself():
    c = paper_cluster("ds-v3.2-660b", "4P6D", ep_group_prefill_nodes=2, ep_group_decode_nodes=8)
    assert (c.prefill_ep_nodes, c.decode_ep_nodes) == (2, 6)
    assert (paper_cluster("ds-v3.2-660b", "4P6D").prefill_ep_nodes) == 4  # None: the role
    _, pe_hbm, de_hbm = compute_for(SimConfig(cluster=c))
    assert pe_hbm == c.kv_hbm_bytes_per_gpu(2) < c.kv_hbm_bytes_per_gpu(4) and de_hbm == c.kv_hbm_bytes_per_gpu(6)
    for bad in (0, -1, True, 1.5):
        with pytest.raises(InputError, match="ep_group_prefill_nodes"):
            paper_cluster("ds-27b", "2P2D", ep_group_prefill_nodes=bad)


def _tpot(pd, agents, **groups):
    cfg = SimConfig(cluster=paper_cluster("ds-27b", pd, **groups),
                    workload=WorkloadConfig(max_len_tokens=32768, num_agents=agents, seed=4))
    trajs, arrivals = load_trajectories(cfg)
    return Simulator(cfg, parse_mode("dualpath"), trajs, arrivals).run()["tpot_s"]["mean"]


def test_two_units_with_their_own_groups_decode_as_one_unit_does():
    unit = _tpot("1P1D", 24)
    grouped = _tpot("2P2D", 48, ep_group_prefill_nodes=1, ep_group_decode_nodes=1)
    spanning = _tpot("2P2D", 48)
    assert grouped == pytest.approx(unit, rel=0.01)
    assert abs(spanning / unit - 1) > 0.02  # EP16 over two nodes: other shards and CNIC traffic
