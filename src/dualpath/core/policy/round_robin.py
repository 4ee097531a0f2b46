"""Round-robin baseline (the "without DualPath scheduler" arm of the ablation, and the
load-balance comparison of docs/paper.md §6.6).

PE: engines in a fixed rotation, skipping those over the same unfinished-token cap beta as
Algorithm 1 (without a cap every queued request would be pushed onto PEs at once); read queues
are ignored. DE: rotation among DEs whose free HBM fits the request. Read side: alternates
PE, DE, PE, ... per request when the DE read path is enabled.

The rotation position is state; it lives in a frozen `RoundRobinCursor` that the caller keeps
and the functions return updated.
"""

from __future__ import annotations

from typing import Final, Iterable, Sequence, final

from ..record import Record
from ..snapshot import Assignment, EngineLoad, QueuedRequest, ReadSide


@final
class RoundRobinCursor(Record):
    """Where the next rotation starts; a new one per decision, read-only (a `Record`)."""

    __slots__ = ("position",)

    def __init__(self, position: int = 0) -> None:
        self.position: Final = position

    def _key(self) -> tuple[int]:
        return (self.position,)


def _rotation(engines: Sequence[int], start: int) -> list[int]:
    k = start % len(engines)
    return list(engines[k:]) + list(engines[:k])


def round_robin_prefill(
    group: Sequence[EngineLoad], queue: Iterable[QueuedRequest], beta_tokens: int, cursor: RoundRobinCursor
) -> tuple[tuple[Assignment, ...], RoundRobinCursor]:
    ids = [e.engine for e in group]
    tok = {e.engine: e.num_tokens for e in group}
    pos = cursor.position
    out: list[Assignment] = []
    for req in queue:
        pick = next((e for e in _rotation(ids, pos) if tok[e] <= beta_tokens), None)
        if pick is None:
            break
        tok[pick] += req.num_tokens
        pos = ids.index(pick) + 1
        out.append(Assignment(req.rid, pick))
    return tuple(out), RoundRobinCursor(pos % len(ids) if ids else 0)


def round_robin_decode(
    engines: Sequence[EngineLoad], queue: Iterable[QueuedRequest], cursor: RoundRobinCursor
) -> tuple[tuple[Assignment, ...], RoundRobinCursor]:
    ids = [e.engine for e in engines]
    free = {e.engine: e.free_hbm_bytes for e in engines}
    pos = cursor.position
    out: list[Assignment] = []
    for req in queue:
        pick = next((e for e in _rotation(ids, pos) if free[e] >= req.hbm_bytes), None)
        if pick is None:
            break
        free[pick] -= req.hbm_bytes
        pos = ids.index(pick) + 1
        out.append(Assignment(req.rid, pick))
    return tuple(out), RoundRobinCursor(pos % len(ids) if ids else 0)


def round_robin_read_side(cursor: RoundRobinCursor) -> tuple[ReadSide, RoundRobinCursor]:
    side = ReadSide.PREFILL if cursor.position % 2 == 0 else ReadSide.DECODE
    return side, RoundRobinCursor(cursor.position + 1)
