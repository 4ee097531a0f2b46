"""One unit's share of a deployment's agents (workloads/sample.py, WorkloadConfig.unit_of): one of
every k by generated tokens, the longest kept, the work per agent the whole's; the generator's
first N / k agents are a lighter sample on the plan check's 32K case."""

from __future__ import annotations

import pytest

from dualpath.config import SimConfig, WorkloadConfig
from dualpath.errors import InputError
from dualpath.sim.runner import load_trajectories
from dualpath.workloads import generate
from dualpath.workloads.sample import chain_tokens, one_unit_share, work_tokens


def _mean(trajs, f=work_tokens) -> float:
    return sum(f(t) for t in trajs) / len(trajs)


@pytest.mark.parametrize("max_len, agents, k", [(32768, 512, 4), (65536, 1024, 2)])
def test_one_in_k_keeps_the_longest_chain_and_the_work_per_agent(max_len, agents, k):
    whole = generate(max_len, agents, 1)
    unit = one_unit_share(whole, k)
    assert len(unit) == agents // k and [t.agent for t in unit] == list(range(agents // k))
    assert max(map(chain_tokens, unit)) == max(map(chain_tokens, whole))
    assert _mean(unit) == pytest.approx(_mean(whole), rel=0.005)
    assert _mean(unit, chain_tokens) == pytest.approx(_mean(whole, chain_tokens), rel=0.01)
    assert one_unit_share(whole, 1) == whole


def test_the_first_agents_are_a_lighter_sample():
    whole = generate(32768, 512, 1)
    first = whole[:128]  # what a unit of 128 generated agents was
    assert _mean(first) < 0.97 * _mean(whole)
    assert max(map(chain_tokens, first)) < 0.9 * max(map(chain_tokens, whole))


def test_the_workload_config_generates_a_units_share():
    w = WorkloadConfig(max_len_tokens=32768, num_agents=128, seed=1, unit_of=4)
    trajs, arrivals = load_trajectories(SimConfig(workload=w))
    assert [t.turns for t in trajs] == [t.turns for t in one_unit_share(generate(32768, 512, 1), 4)]
    assert len(arrivals) == 128
    with pytest.raises(InputError, match="unit_of must be at least 1"):
        WorkloadConfig(unit_of=0)
    with pytest.raises(InputError, match="a trajectory file is replayed as it is"):
        WorkloadConfig(unit_of=2, trajectory_file="x.jsonl")
