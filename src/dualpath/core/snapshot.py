"""Read-only views of cluster state handed to the policy, and the read-only decisions it returns.

Engines report three values when their group fetches (docs/paper.md §3.1): `num_seqs` (seq_e,
assigned but unfinished requests), `num_tokens` (tok_e, total tokens of those requests) and, for
the node they sit on, the disk-read queue in tokens. DEs also report free HBM in bytes.

The records built on every pass, request or forward are `Record`s (core/record.py says why not
frozen dataclasses).
"""

from __future__ import annotations

import enum
from typing import Final, final

from .record import Record
from .request import RequestId


@final
class EngineLoad(Record):
    """One engine's counters as its group reports them. No validation here: built on the
    scheduler's hot path from counters whose ledgers the owner's check_invariants() checks."""

    __slots__ = ("engine", "node", "num_seqs", "num_tokens", "free_hbm_bytes")

    def __init__(self, engine: int, node: int, num_seqs: int, num_tokens: int, free_hbm_bytes: int = 0) -> None:
        self.engine: Final = engine
        self.node: Final = node
        self.num_seqs: Final = num_seqs  # seq_e
        self.num_tokens: Final = num_tokens  # tok_e
        self.free_hbm_bytes: Final = free_hbm_bytes  # a DE's; 0 for a PE

    def _key(self) -> tuple[int, int, int, int, int]:
        return (self.engine, self.node, self.num_seqs, self.num_tokens, self.free_hbm_bytes)


@final
class GroupLoad(Record):
    """An engine group: all engines of one node, all PEs or all DEs (docs/paper.md §3.1)."""

    __slots__ = ("group", "engines")

    def __init__(self, group: int, engines: tuple[EngineLoad, ...]) -> None:
        self.group: Final = group
        self.engines: Final = engines

    @property
    def num_tokens(self) -> int:
        return sum([e.num_tokens for e in self.engines])

    def _key(self) -> tuple[int, tuple[EngineLoad, ...]]:
        return (self.group, self.engines)


@final
class QueuedRequest(Record):
    """A request as the policy sees it.

    `num_tokens` is len(r) as the policies read it (the prompt length), the tokens a PE's tok_e
    grows by; `hbm_bytes` is the DE HBM it needs for its whole decode; `decode_tokens` is what a
    DE's tok_e grows by when it takes the request (the world's own count: prompt + generated in
    the simulator, prompt + max_tokens in whole blocks in the runtime), which the scheduler adds
    to its per-group totals. `uncached_tokens` is the prompt less the hit the world expects at
    arrival (None: not known), which `+selective` reads (policy/local.py).
    """

    __slots__ = ("rid", "num_tokens", "hbm_bytes", "decode_tokens", "uncached_tokens")

    def __init__(self, rid: RequestId, num_tokens: int, hbm_bytes: int, decode_tokens: int,
                 uncached_tokens: int | None = None) -> None:
        self.rid: Final = rid
        self.num_tokens: Final = num_tokens
        self.hbm_bytes: Final = hbm_bytes
        self.decode_tokens: Final = decode_tokens
        self.uncached_tokens: Final = uncached_tokens

    def _key(self) -> tuple[RequestId, int, int, int, int | None]:
        return (self.rid, self.num_tokens, self.hbm_bytes, self.decode_tokens, self.uncached_tokens)


class ReadSide(enum.IntEnum):
    PREFILL = 0  # storage -> PE node SNIC -> PE buffer (the conventional path)
    DECODE = 1  # storage -> DE node SNIC -> DE buffer -> CNIC RDMA -> PE (DualPath's new path)


@final
class Assignment(Record):
    """A request to an engine (a PE, or a DE inside its group)."""

    __slots__ = ("rid", "engine")

    def __init__(self, rid: RequestId, engine: int) -> None:
        self.rid: Final = rid
        self.engine: Final = engine

    def _key(self) -> tuple[RequestId, int]:
        return (self.rid, self.engine)


@final
class GroupAssignment(Record):
    """A request to a DE group's private queue (phase 1)."""

    __slots__ = ("rid", "group")

    def __init__(self, rid: RequestId, group: int) -> None:
        self.rid: Final = rid
        self.group: Final = group

    def _key(self) -> tuple[RequestId, int]:
        return (self.rid, self.group)


@final
class BatchCandidate(Record):
    """A request waiting in a PE's batch queue: `cached_tokens` already have KV (hit plus earlier
    chunks); `remaining_tokens` still need computing. Built per queued request at every forward."""

    __slots__ = ("rid", "cached_tokens", "remaining_tokens")

    def __init__(self, rid: RequestId, cached_tokens: int, remaining_tokens: int) -> None:
        self.rid: Final = rid
        self.cached_tokens: Final = cached_tokens
        self.remaining_tokens: Final = remaining_tokens

    def _key(self) -> tuple[RequestId, int, int]:
        return (self.rid, self.cached_tokens, self.remaining_tokens)


@final
class BatchEntry(Record):
    """A request in a PE forward: `compute_tokens` of it computed on top of `cached_tokens`."""

    __slots__ = ("rid", "cached_tokens", "compute_tokens")

    def __init__(self, rid: RequestId, cached_tokens: int, compute_tokens: int) -> None:
        self.rid: Final = rid
        self.cached_tokens: Final = cached_tokens
        self.compute_tokens: Final = compute_tokens

    def _key(self) -> tuple[RequestId, int, int]:
        return (self.rid, self.cached_tokens, self.compute_tokens)
