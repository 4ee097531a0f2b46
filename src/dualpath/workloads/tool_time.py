"""Tool time for generated agents: how long an agent waits between a round's answer and its next
request (`TurnSpec.wait_s`).

The paper replays rounds back to back, with no tool or think time (docs/paper.md §4.2); real
agents run a tool between rounds. `with_tool_times` gives every round after the first a wait
drawn from a log-normal distribution, `median_s * exp(sigma * Z)` with Z standard normal: the
median a flag, the spread another (sigma = 1: a tenth of the waits below 0.28 times the
median, a tenth above 3.6 times it). The draws come from their own random stream (`seed` and a
fixed salt), so the rounds' token counts are those of the same seed without tool time.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Sequence

import numpy as np

from dualpath.errors import InputError
from dualpath.workloads.trajectory import Trajectory

TOOL_STREAM_SALT = 0x7001  # the tool-time stream of a seed, apart from the generator's (any fixed value)


def check_tool_time(median_s: float, sigma: float) -> None:
    if not 0.0 <= median_s < math.inf:
        raise InputError(f"--tool-time must be a finite number of seconds >= 0, got {median_s}")
    if not 0.0 <= sigma < math.inf:
        raise InputError(f"--tool-sigma must be finite and >= 0, got {sigma}")


def with_tool_times(trajs: Sequence[Trajectory], median_s: float, sigma: float, seed: int) -> tuple[Trajectory, ...]:
    """The same agents, each round after the first waiting a log-normal tool time (module docstring);
    a median of 0 leaves them as they are. Agents that already carry waits (a file's) are refused."""
    check_tool_time(median_s, sigma)
    if median_s == 0.0:
        return tuple(trajs)
    if any(t.wait_s for traj in trajs for t in traj.turns):
        raise InputError("the workload's agents carry their own tool times; --tool-time would replace them")
    rng = np.random.default_rng((seed, TOOL_STREAM_SALT))
    out = []
    for traj in trajs:
        waits = median_s * np.exp(sigma * rng.standard_normal(len(traj.turns) - 1))
        turns = (traj.turns[0],) + tuple(replace(t, wait_s=float(w)) for t, w in zip(traj.turns[1:], waits))
        out.append(Trajectory(traj.agent, turns, traj.arrival_s))
    return tuple(out)


def total_wait_s(traj: Trajectory) -> float:
    """The agent's tool time over its whole trajectory."""
    return sum(t.wait_s for t in traj.turns)
