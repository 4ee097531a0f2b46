"""Agents that wait for tools, in both worlds: the simulator starts a round its tool time after the
round before ends, and the runtime's replay sends it so; a file's arrival times are kept."""

from __future__ import annotations

import asyncio
import math

import pytest

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.core.request import TurnSpec
from dualpath.runtime.api import TokenEvent
from dualpath.runtime.apps.replay import replay_trajectories
from dualpath.runtime.clock import MonotonicClock
from dualpath.sim.runner import load_workload
from dualpath.sim.simulator import Simulator
from dualpath.workloads import generate, write_trajectories
from dualpath.workloads.tool_time import with_tool_times
from dualpath.workloads.trajectory import Trajectory

AGENTS = (
    Trajectory(0, (TurnSpec(3000, 20), TurnSpec(400, 10, 7.5), TurnSpec(300, 5, 0.0), TurnSpec(200, 8, 30.0))),
    Trajectory(1, (TurnSpec(5000, 12), TurnSpec(100, 4, 1.25)), arrival_s=40.0),
)


def _run(cfg, mode):
    w = load_workload(cfg)
    sim = Simulator(cfg, parse_mode(mode), w.agents, w.arrivals_s)
    result = sim.run()
    rec = sim.recorder
    turns = {(a, t): (arr, fin) for a, t, arr, fin in zip(rec.agent, rec.turn, rec.arrival_s, rec.finish_s)}
    return result, turns


@pytest.mark.parametrize("mode", ["basic", "dualpath", "dualpath+split"])
def test_a_round_starts_its_tool_time_after_the_round_before(tmp_path, mode):
    path = tmp_path / "agents.jsonl"
    write_trajectories(path, AGENTS)
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"),
                    workload=WorkloadConfig(max_len_tokens=65536, num_agents=2, trajectory_file=str(path)),
                    check_invariants_every=1)
    result, turns = _run(cfg, mode)
    assert turns[(1, 0)][0] == 40.0  # the file's arrival_s, not the offline start at 0
    assert turns[(0, 0)][0] == 0.0
    for traj in AGENTS:
        for i in range(1, traj.num_turns):
            arrival, _ = turns[(traj.agent, i)]
            assert math.isclose(arrival, turns[(traj.agent, i - 1)][1] + traj.turns[i].wait_s, abs_tol=1e-9)
    # the waits are the agent's, not the cluster's: TTFT leaves them out, JCT holds them
    assert result["jct_s"] >= 7.5 + 30.0
    assert result["ttft_s"]["p99"] < 5.0


def test_generated_agents_wait_the_draws_of_their_seed():
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"),
                    workload=WorkloadConfig(max_len_tokens=16384, num_agents=6, seed=2, tool_time_median_s=3.0))
    expected = with_tool_times(generate(16384, 6, 2), 3.0, 1.0, 2)
    plain = SimConfig(cluster=cfg.cluster, workload=WorkloadConfig(max_len_tokens=16384, num_agents=6, seed=2))
    (timed, turns), (back_to_back, _) = _run(cfg, "dualpath"), _run(plain, "dualpath")
    for traj in expected:
        for i in range(1, traj.num_turns):
            gap = turns[(traj.agent, i)][0] - turns[(traj.agent, i - 1)][1]
            assert math.isclose(gap, traj.turns[i].wait_s, rel_tol=1e-9, abs_tol=1e-9)
    assert timed["num_turns"] == back_to_back["num_turns"]
    longest_wait = max(sum(t.wait_s for t in traj.turns) for traj in expected)
    assert timed["jct_s"] >= longest_wait > 0 and timed["jct_s"] > back_to_back["jct_s"]


class _Router:
    """Answers each request at once with `gen` tokens, noting when it came."""

    def __init__(self, clock):
        self.clock, self.sent_s = clock, {}

    async def generate(self, req):
        self.sent_s[req.request_id] = self.clock.now_s()
        n = req.params.max_tokens
        for k in range(n):
            yield TokenEvent(100 + k, k, k == n - 1, "length" if k == n - 1 else None, len(req.prompt_ids), 0)


def test_the_runtime_replay_sends_a_round_its_tool_time_after_the_answer_before():
    clock = MonotonicClock()
    router = _Router(clock)
    agents = [Trajectory(0, (TurnSpec(30, 2), TurnSpec(5, 2, 0.3), TurnSpec(5, 1, 0.0))),
              Trajectory(1, (TurnSpec(20, 1), TurnSpec(4, 1, 0.1)))]
    records = asyncio.run(replay_trajectories(router, agents, [0.0, 0.0], 1000, clock))
    by_turn = {(r.agent, r.turn): r for r in records}
    for traj in agents:
        for i in range(1, traj.num_turns):
            gap = by_turn[(traj.agent, i)].arrival_s - by_turn[(traj.agent, i - 1)].finish_s
            wait = traj.turns[i].wait_s
            assert wait <= gap < wait + 0.1, (traj.agent, i, gap)


def test_a_trace_of_requests_refuses_tool_time(tmp_path):
    import json

    from dualpath.errors import InputError

    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}) + "\n")
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"),
                    workload=WorkloadConfig(num_agents=1, trajectory_file=str(path), tool_time_median_s=2.0))
    with pytest.raises(InputError, match="--tool-time are for agents"):
        load_workload(cfg)
