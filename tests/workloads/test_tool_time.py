"""Tool time between an agent's rounds: log-normal waits for generated agents (workloads/tool_time.py)
and agentic Mooncake traces, sessions whose requests wait for each other (workloads/agentic.py)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads import WorkloadFormat, detect_format, generate, read_agentic, read_agents
from dualpath.workloads.tool_time import total_wait_s, with_tool_times
from dualpath.workloads.trajectory import Trajectory


def test_waits_are_log_normal_around_the_median_and_leave_the_tokens_alone():
    trajs = generate(32768, 64, seed=3)
    timed = with_tool_times(trajs, 4.0, 1.0, seed=3)
    assert [[(t.append_tokens, t.gen_tokens) for t in a.turns] for a in timed] == \
        [[(t.append_tokens, t.gen_tokens) for t in a.turns] for a in trajs]
    assert all(a.turns[0].wait_s == 0.0 for a in timed)  # a first round waits for nothing: it is the arrival
    waits = np.array([t.wait_s for a in timed for t in a.turns[1:]])
    assert len(waits) > 1000 and (waits > 0).all()
    logs = np.log(waits / 4.0)
    assert abs(np.median(waits) / 4.0 - 1) < 0.1  # median 4 s
    assert abs(logs.std() - 1.0) < 0.05  # sigma 1
    assert with_tool_times(trajs, 4.0, 1.0, seed=3) == timed  # deterministic for a seed
    assert with_tool_times(trajs, 4.0, 1.0, seed=4) != timed
    assert math.isclose(total_wait_s(timed[0]), sum(t.wait_s for t in timed[0].turns))


def test_sigma_zero_waits_the_median_exactly_and_median_zero_changes_nothing():
    trajs = generate(16384, 4, seed=1)
    assert {t.wait_s for a in with_tool_times(trajs, 2.5, 0.0, 1) for t in a.turns[1:]} == {2.5}
    assert with_tool_times(trajs, 0.0, 1.0, 1) == tuple(trajs)


def test_agents_with_their_own_waits_and_bad_values_are_refused():
    timed = (Trajectory(0, (TurnSpec(10, 1), TurnSpec(5, 1, 1.0))),)
    with pytest.raises(InputError, match="carry their own tool times"):
        with_tool_times(timed, 2.0, 1.0, 1)
    for median, sigma in ((-1.0, 1.0), (math.inf, 1.0), (math.nan, 1.0), (1.0, -0.5)):
        with pytest.raises(InputError, match="--tool"):
            with_tool_times(timed, median, sigma, 1)
    with pytest.raises(ValueError, match="wait_s"):
        TurnSpec(1, 1, -2.0)


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# two sessions as Dynamo's agent tooling writes them: s1 runs a tool of 100 ms (+100 ms of other
# gap) between its requests; s2 starts 2.5 s after s1
AGENTIC = [
    {"session_id": "s1", "request_id": "r1", "input_length": 1000, "output_length": 50, "hash_ids": [1, 2],
     "timestamp": 1000},
    {"session_id": "s2", "request_id": "q1", "input_length": 600, "output_length": 0, "hash_ids": [7, 8],
     "timestamp": 3500},
    {"session_id": "s1", "request_id": "r2", "input_length": 1300, "output_length": 20, "hash_ids": [1, 2, 3],
     "timestamp": 1300, "wait_for": ["r1"], "delay": 100, "tool_wait_ms": 100},
    {"session_id": "s1", "request_id": "r3", "input_length": 1310, "output_length": 5, "hash_ids": [1, 2, 3],
     "timestamp": 1800, "wait_for": ["r2"], "delay": 0, "tool_wait_ms": 2500},
]


def test_an_agentic_trace_replays_each_session_as_one_trajectory(tmp_path):
    path = _write(tmp_path / "agentic.jsonl", AGENTIC)
    assert detect_format(path) is WorkloadFormat.AGENTIC
    got = read_agentic(path)
    s1, s2 = got.trajectories
    # appends: each prompt less the session's context (earlier prompts and outputs)
    assert s1.turns == (TurnSpec(1000, 50), TurnSpec(1300 - 1050, 20, 0.2), TurnSpec(0, 5, 2.5))
    assert [s1.input_tokens(i) for i in range(3)] == [1000, 1300, 1320]  # the last is 10 tokens longer than recorded
    assert (got.lengthened_requests, got.lengthened_tokens) == (1, 1320 - 1310)
    assert s2.turns == (TurnSpec(600, 1),)  # output 0 generates one token
    assert (s1.arrival_s, s2.arrival_s) == (0.0, 2.5)  # from the sessions' first timestamps
    assert read_agents(path) == got.trajectories


@pytest.mark.parametrize("change, problem", [
    (lambda rows: rows[2].update(wait_for=["q1"]), "may wait only for its session's previous request"),
    (lambda rows: rows[0].update(wait_for=["r0"]), "may wait only for its session's previous request"),
    (lambda rows: rows[3].update(prefix_reset=True), "prefix_reset on a later request"),
    (lambda rows: rows[1].pop("timestamp"), "has no timestamp while others have one"),
    (lambda rows: rows[2].update(tool_wait_ms=-5), "tool_wait_ms must be a finite number >= 0"),
    (lambda rows: rows[2].pop("input_length"), "missing field input_length"),
    (lambda rows: rows[2].update(session_id=["s1"]), "session_id must be a string or an integer"),
])
def test_a_bad_agentic_trace_names_its_line(tmp_path, change, problem):
    rows = [dict(r) for r in AGENTIC]
    change(rows)
    path = _write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(InputError, match=problem) as err:
        read_agentic(path)
    assert f"{path} line " in str(err.value)


def test_read_agents_refuses_a_trace_of_requests(tmp_path):
    path = _write(tmp_path / "mc.jsonl", [{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}])
    with pytest.raises(InputError, match="a Mooncake trace of requests"):
        read_agents(path)


def test_trace_gen_writes_the_waits_that_sim_replays(tmp_path):
    """`trace gen --tool-time` writes each round's wait as its third number; the file reads back the same agents."""
    from cli_helpers import cli_here

    from dualpath.workloads import read_trajectories, trajectory_stats

    path = tmp_path / "t.jsonl"
    r = cli_here("trace", "gen", "--max-len", "16k", "--agents", "5", "--seed", "3", "--tool-time", "2", "-o", str(path))
    assert r.returncode == 0, r.stderr
    back = read_trajectories(path)
    assert back == with_tool_times(generate(16384, 5, 3), 2.0, 1.0, 3)
    assert trajectory_stats(back)["median_tool_time_s"] > 0
    bad = cli_here("trace", "gen", "--tool-time", "-1", "-o", str(tmp_path / "x.jsonl"))
    assert bad.returncode == 2 and "--tool-time" in bad.stderr and "Traceback" not in bad.stderr
