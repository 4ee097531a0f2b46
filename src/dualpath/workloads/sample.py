"""One unit's share of a deployment's agents (WorkloadConfig.unit_of).

A deployment of k identical units serving N agents is simulated as one unit serving N / k of them
(`dualpath plan`, docs/guide/simulator.md). Which N / k decides how well the unit predicts the
whole: the generator's first N / k agents are a sample of their own, and on the plan check's 32K
workload their longest agent generated 11% fewer tokens than the longest of the whole's 4N / k, so
the unit finished 9% early (an offline JCT ends with its slowest agent, and an agent's decode steps
run one after another). Here the agents are ordered by the tokens they generate (their chain of
decode steps), longest first, and cut into strata of k neighbours; the first stratum gives the unit
its longest member, each later one the member whose work (the tokens every turn's sequence loads
and attends to) is nearest the stratum's mean plus what the strata before fell short of theirs. The unit's longest agent is the
whole's, its generated tokens follow the whole's distribution stratum by stratum, and its load per
agent is the whole's.
"""

from __future__ import annotations

from typing import Sequence

from .trajectory import Trajectory


def work_tokens(t: Trajectory) -> int:
    """Sum over turns of the sequence length after the turn: the tokens its turns load and attend to."""
    return sum(t.end_tokens(i) for i in range(len(t.turns)))


def chain_tokens(t: Trajectory) -> int:
    """Tokens generated over the trajectory: its decode steps, one after another."""
    return sum(turn.gen_tokens for turn in t.turns)


def one_unit_share(trajs: Sequence[Trajectory], k: int) -> tuple[Trajectory, ...]:
    """One of every k of `trajs` (module docstring), in their original order, renumbered 0..n-1;
    k = 1: `trajs` as they are."""
    if k == 1:
        return tuple(trajs)
    work = [work_tokens(t) for t in trajs]
    by_chain = sorted(range(len(trajs)), key=lambda i: (-chain_tokens(trajs[i]), -work[i], trajs[i].agent))
    strata = [by_chain[s:s + k] for s in range(0, len(by_chain) - k + 1, k)]
    kept = [strata[0][0]]  # the longest chain
    owed = sum(work[i] for i in strata[0]) / k - work[kept[0]]  # work the strata expected, less what was kept
    for stratum in strata[1:]:
        expected = sum(work[i] for i in stratum) / k + owed
        pick = min(stratum, key=lambda i: (abs(expected - work[i]), trajs[i].agent))
        kept.append(pick)
        owed = expected - work[pick]
    return tuple(Trajectory(n, trajs[i].turns, trajs[i].arrival_s) for n, i in enumerate(sorted(kept)))
