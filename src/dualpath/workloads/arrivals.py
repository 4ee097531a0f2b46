"""When agents start (docs/paper.md §6.1 offline, §6.4 online).

Offline (RL rollout): all agents launch at once. Online: agents arrive as a Poisson process at
`agents_per_s` (the paper's APS); each then replays its rounds back to back, with zero tool
latency and think time (docs/paper.md §4.2).
"""

from __future__ import annotations

import numpy as np

from dualpath.workloads._checks import require_int, require_positive_float


def offline_arrivals(num_agents: int) -> tuple[float, ...]:
    """Every agent starts at t = 0 s."""
    num_agents = require_int(num_agents, 1, "num_agents")
    return (0.0,) * num_agents


def poisson_arrivals(num_agents: int, agents_per_s: float, seed: int) -> tuple[float, ...]:
    """Arrival times (s) of a Poisson process, sorted; agent k gets the k-th time.

    Gaps are i.i.d. exponential with mean 1 / agents_per_s; the first agent arrives after the
    first gap, not at 0, so every agent sees the same process. The same seed gives the same times.
    """
    num_agents = require_int(num_agents, 1, "num_agents")
    agents_per_s = require_positive_float(agents_per_s, "agents_per_s")
    seed = require_int(seed, 0, "seed")
    gaps_s = np.random.default_rng(seed).exponential(1.0 / agents_per_s, size=num_agents)
    return tuple(float(t) for t in np.cumsum(gaps_s))

