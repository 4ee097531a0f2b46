"""Frozen views of cluster state handed to the policy, and the frozen decisions it returns.

Engines report three values when their group fetches (docs/paper.md §3.1): `num_seqs` (seq_e,
assigned but unfinished requests), `num_tokens` (tok_e, total tokens of those requests) and, for
the node they sit on, the disk-read queue in tokens. DEs also report free HBM in bytes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from .request import RequestId


@dataclass(frozen=True, slots=True)
class EngineLoad:
    engine: int
    node: int
    num_seqs: int
    num_tokens: int
    free_hbm_bytes: int = 0
    # No validation here: built on the scheduler's hot path from counters whose ledgers are
    # checked by the owner's check_invariants().


@dataclass(frozen=True, slots=True)
class GroupLoad:
    """An engine group: all engines of one node, all PEs or all DEs (docs/paper.md §3.1)."""

    group: int
    engines: tuple[EngineLoad, ...]

    @property
    def num_tokens(self) -> int:
        return sum([e.num_tokens for e in self.engines])


@dataclass(frozen=True, slots=True)
class QueuedRequest:
    """A request as the policy sees it.

    `num_tokens` is len(r) as the policies read it (the prompt length), the tokens a PE's tok_e
    grows by; `hbm_bytes` is the DE HBM it needs for its whole decode; `decode_tokens` is what a
    DE's tok_e grows by when it takes the request (the world's own count: prompt + generated in
    the simulator, prompt + max_tokens in whole blocks in the runtime), which the scheduler adds
    to its per-group totals. `uncached_tokens` is the prompt less the hit the world expects at
    arrival (None: not known), which `+selective` reads (policy/local.py).
    """

    rid: RequestId
    num_tokens: int
    hbm_bytes: int
    decode_tokens: int
    uncached_tokens: int | None = None


class ReadSide(enum.IntEnum):
    PREFILL = 0  # storage -> PE node SNIC -> PE buffer (the conventional path)
    DECODE = 1  # storage -> DE node SNIC -> DE buffer -> CNIC RDMA -> PE (DualPath's new path)


@dataclass(frozen=True, slots=True)
class Assignment:
    rid: RequestId
    engine: int


@dataclass(frozen=True, slots=True)
class GroupAssignment:
    rid: RequestId
    group: int


@dataclass(frozen=True, slots=True)
class BatchCandidate:
    """A request waiting in a PE's batch queue: `cached_tokens` already have KV (hit plus earlier
    chunks); `remaining_tokens` still need computing."""

    rid: RequestId
    cached_tokens: int
    remaining_tokens: int


@dataclass(frozen=True, slots=True)
class BatchEntry:
    rid: RequestId
    cached_tokens: int
    compute_tokens: int
