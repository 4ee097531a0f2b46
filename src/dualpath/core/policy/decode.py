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
    n = len(groups)
    out: list[GroupAssignment] = []
    for req in queue:
        i = 0  # the least (total, group id), in one pass
        least, least_g = totals[0], groups[0]
        for j in range(1, n):
            t = totals[j]
            if t < least or (t == least and groups[j] < least_g):
                i, least, least_g = j, t, groups[j]
        totals[i] += req.num_tokens
        out.append(GroupAssignment(req.rid, groups[i]))
    return tuple(out)


def _fit_prefix_tokens(group: GroupLoad, private_queue: Sequence[QueuedRequest]) -> int:
    free = sum([e.free_hbm_bytes for e in group.engines])
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
    tok: dict[int, int] = {}
    seq: dict[int, int] = {}
    free: dict[int, int] = {}
    for e in engines:
        tok[e.engine] = e.num_tokens
        seq[e.engine] = e.num_seqs
        free[e.engine] = e.free_hbm_bytes
    out: list[Assignment] = []
    for req in private_queue:
        de = _choose_de(tok, seq, free, req.hbm_bytes, req.num_tokens, z)
        if de is None:
            break
        tok[de] += req.num_tokens
        seq[de] += 1
        free[de] -= req.hbm_bytes
        out.append(Assignment(req.rid, de))
    return tuple(out)


def _choose_de(tok: dict[int, int], seq: dict[int, int], free: dict[int, int], hbm_bytes: int, num_tokens: int,
               z: float) -> int | None:
    """Step 3 for one request, in one pass over the DEs: among those whose free HBM fits it, the
    least (seq_e, tok_e, id) of those with tok_e + len(r) <= Z, else the least (tok_e, id); None if
    none fits. (The keys hold the id, so the least is unique whatever the walk's order.)"""
    low: int | None = None
    fit: int | None = None
    low_seq = low_tok = fit_tok = 0
    for e, t in tok.items():
        if free[e] < hbm_bytes:
            continue
        if fit is None or t < fit_tok or (t == fit_tok and e < fit):
            fit, fit_tok = e, t
        if t + num_tokens <= z:
            s = seq[e]
            if low is None or s < low_seq or (s == low_seq and (t < low_tok or (t == low_tok and e < low))):
                low, low_seq, low_tok = e, s, t
    return fit if low is None else low
