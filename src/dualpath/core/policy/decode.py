"""DE selection in two phases (docs/paper.md §3.3). Does not keep global FIFO order across groups.

Phase 1 (across groups): when a DE group fetches, the global DE queue is drained; each request
goes to the private queue of the group with the least total tokens (sum of tok_e), which grows
by len(r) as requests are placed. Ties go to the lower group id.

Phase 2 (inside a group):
  1. Walk the private queue from the head while the running sum of HBM needs fits the group's
     total free HBM (no fragmentation assumed): that prefix is R.
  2. Z = z_factor * (sum of len(r) over R + sum of tok_e over the group) / |E|, z_factor = 1.05.
  3. Pop the head r. Among DEs whose free HBM fits r: those with tok_e + len(r) <= Z are
     preferred, taking the least seq_e (ties: least tok_e, then id); if none, the DE with the least
     tok_e (ties: id) among those over Z.
  4. If no DE fits r, the fetch stops (the head keeps its place).
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from ..snapshot import Assignment, GroupAssignment, GroupLoad, QueuedRequest

Z_FACTOR_DEFAULT = 1.05  # docs/paper.md §3.3 (its origin is not explained in the paper)


def distribute_to_groups(group_tokens: Mapping[int, int], queue: Iterable[QueuedRequest]) -> tuple[GroupAssignment, ...]:
    """Phase 1: every queued request to the group with the least total tokens (sum of tok_e over
    the group's engines, given per group id)."""
    if not group_tokens:
        raise ValueError("no DE groups")
    groups = list(group_tokens)
    totals = list(group_tokens.values())
    out: list[GroupAssignment] = []
    for req in queue:
        least = min(totals)
        if totals.count(least) == 1:
            i = totals.index(least)
        else:  # ties: the lower group id
            i = min((g, j) for j, g in enumerate(groups) if totals[j] == least)[1]
        totals[i] += req.num_tokens
        out.append(GroupAssignment(req.rid, groups[i]))
    return tuple(out)


def _fit_prefix_tokens(group: GroupLoad, private_queue: Sequence[QueuedRequest]) -> int:
    free = sum(e.free_hbm_bytes for e in group.engines)
    tokens = 0
    for req in private_queue:
        if req.hbm_bytes > free:
            break
        free -= req.hbm_bytes
        tokens += req.num_tokens
    return tokens


def select_decode(
    group: GroupLoad,
    private_queue: Sequence[QueuedRequest],
    z_factor: float = Z_FACTOR_DEFAULT,
) -> tuple[Assignment, ...]:
    """Phase 2: assign a prefix of the group's private queue to its DEs; see module docstring."""
    engines = group.engines
    if not engines:
        return ()
    z = z_factor * (_fit_prefix_tokens(group, private_queue) + group.num_tokens) / len(engines)
    tok = {e.engine: e.num_tokens for e in engines}
    seq = {e.engine: e.num_seqs for e in engines}
    free = {e.engine: e.free_hbm_bytes for e in engines}
    out: list[Assignment] = []
    for req in private_queue:
        fits = [e for e in tok if free[e] >= req.hbm_bytes]
        if not fits:
            break
        low = [e for e in fits if tok[e] + req.num_tokens <= z]
        if low:
            de = min(low, key=lambda e: (seq[e], tok[e], e))
        else:
            de = min(fits, key=lambda e: (tok[e], e))
        tok[de] += req.num_tokens
        seq[de] += 1
        free[de] -= req.hbm_bytes
        out.append(Assignment(req.rid, de))
    return tuple(out)
