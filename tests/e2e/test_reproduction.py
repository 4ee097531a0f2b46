"""The paper's offline results in the simulator (slow: `make test-slow`, several minutes).

Targets (the paper's, docs/paper.md §6.1 and §6.3): DS 660B 2P4D 64K, JCT(basic)/JCT(dualpath)
within 15% of 1.84 (1024 agents) and 1.87 (2048), oracle <= dualpath <= basic; DS 27B at 1P1D /
2P1D / 1P2D (512 agents): the three pairs the paper calls alike within 10% of each other.
"""

import pytest

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster
from dualpath.sim.runner import run_modes

pytestmark = pytest.mark.slow


def _jct(model, pd, agents, modes, seed=1):
    cfg = SimConfig(cluster=paper_cluster(model, pd), workload=WorkloadConfig(max_len_tokens=65536, num_agents=agents, seed=seed))
    return {r["mode"]: r["jct_s"] for r in run_modes(cfg, modes)["runs"]}


@pytest.mark.parametrize("agents,paper", [(1024, 1.84), (2048, 1.87)])
def test_ds660b_speedup_over_basic(agents, paper):
    jct = _jct("ds-v3.2-660b", "2P4D", agents, ["basic", "dualpath", "oracle"])
    assert jct["oracle"] <= jct["dualpath"] <= jct["basic"]
    assert abs(jct["basic"] / jct["dualpath"] / paper - 1) <= 0.15


def test_ds27b_pd_pairs_alike():
    jct = {pd: _jct("ds-27b", pd, 512, ["basic", "dualpath"]) for pd in ("1P1D", "2P1D", "1P2D")}

    def alike(a, b):
        return abs(a / b - 1) <= 0.10

    assert alike(jct["1P1D"]["basic"], jct["1P2D"]["basic"])
    assert alike(jct["1P1D"]["dualpath"], jct["2P1D"]["basic"])
    assert alike(jct["2P1D"]["dualpath"], jct["1P2D"]["dualpath"])
