"""Mooncake traces (kvcache-ai/Mooncake, FAST'25 release): loader, block rechunking, conversations.

One JSON object per line: `timestamp` (ms, int), `input_length`, `output_length` (tokens) and
`hash_ids`: one opaque id per 512-token block of the prompt, the last block possibly partial,
so len(hash_ids) == ceil(input_length / 512). Ids are prefix-chained: equal ids mean equal
prefixes, so the KV of a block with a seen id is reusable (the trace's README).

Conversation inference. A request continues an earlier request (its parent) when its block list
starts with all of the parent's *full* 512-token blocks (full in the child too) and the parent
has at least two: the shared first block alone is the common system prompt, not a
conversation. The parent's partially filled last block is left out because a follow-up prompt
extends that block, so its id changes: on the FAST'25 conversation trace the stricter "starts
with the parent's complete list" rule finds only 130 continuations (118 of them identical
repeats) where this rule finds 3,975. Of several candidates the longest match wins, then the
latest. Requests that continue none start a conversation (an agent).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from dualpath.errors import InputError
from dualpath.workloads._checks import require_int
from dualpath.workloads.jsonl import int_at_least, jsonl_objects

MOONCAKE_BLOCK_TOKENS = 512
_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_MIN_PARENT_FULL_BLOCKS = 2


@dataclass(frozen=True, slots=True)
class MooncakeRecord:
    """One request; `block_ids` are the trace's block ids (last block maybe partial), each of
    `block_tokens` tokens: 512 as the trace is, fewer once `rescale`d to a small model's window."""

    timestamp_s: float
    input_tokens: int
    output_tokens: int
    block_ids: tuple[int, ...]
    block_tokens: int = MOONCAKE_BLOCK_TOKENS

    @property
    def num_full_blocks(self) -> int:
        return self.input_tokens // self.block_tokens


def rescale(records: tuple[MooncakeRecord, ...] | list[MooncakeRecord], block_tokens: int) -> tuple[MooncakeRecord, ...]:
    """The same requests with every trace block standing for `block_tokens` tokens instead of 512:
    full blocks stay full, a partial last block and the output shrink by block_tokens / 512
    (rounded, at least 1 token), so prefix sharing, the blocks per prompt and the ratio of output
    to input are the trace's while every length fits a small model's window."""
    block_tokens = require_int(block_tokens, 1, "block_tokens")
    out = []
    for r in records:
        full, partial = divmod(r.input_tokens, r.block_tokens)
        tail = 0 if partial == 0 else min(block_tokens, max(1, round(partial * block_tokens / r.block_tokens)))
        gen = 0 if r.output_tokens == 0 else max(1, round(r.output_tokens * block_tokens / r.block_tokens))
        out.append(MooncakeRecord(r.timestamp_s, full * block_tokens + tail, gen, r.block_ids, block_tokens))
    return tuple(out)


def read_mooncake(path: str | Path) -> tuple[MooncakeRecord, ...]:
    """Parse and validate every line; `InputError` names the file, 1-based line and problem."""
    records = [_parse_object(obj, where) for obj, where, _ in jsonl_objects(path, "Mooncake trace")]
    if not records:
        raise InputError(f"{path}: no requests (file is empty)")
    return tuple(records)


def _parse_object(obj: dict, where: str) -> MooncakeRecord:
    missing = [k for k in _FIELDS if k not in obj]
    if missing:
        raise InputError(f"{where}: missing field(s) {', '.join(missing)}")
    timestamp_ms = int_at_least(obj["timestamp"], 0, "timestamp", where)
    input_tokens = int_at_least(obj["input_length"], 1, "input_length", where)
    output_tokens = int_at_least(obj["output_length"], 0, "output_length", where)
    hash_ids = obj["hash_ids"]
    if not isinstance(hash_ids, list):
        raise InputError(f"{where}: hash_ids must be a list of integers")
    for j, h in enumerate(hash_ids):
        int_at_least(h, 0, f"hash_ids[{j}]", where)
    expected = math.ceil(input_tokens / MOONCAKE_BLOCK_TOKENS)
    if len(hash_ids) != expected:
        raise InputError(
            f"{where}: {len(hash_ids)} hash_ids for input_length {input_tokens}, expected "
            f"ceil({input_tokens} / {MOONCAKE_BLOCK_TOKENS}) = {expected}"
        )
    return MooncakeRecord(timestamp_ms / 1000.0, input_tokens, output_tokens, tuple(hash_ids))


class Rechunker:
    """Maps 512-token block ids to ids of `block_tokens`-sized blocks; one instance = one id space.

    Only blocks fully covered by input_tokens are returned (partial blocks are never reused,
    `dualpath.core.blocks`). Ids are interned from (parent id, source ids) in first-seen order,
    so equal prefixes get equal ids and the result is deterministic for a given record order.

    - block_tokens divides 512 (k = 512 // block_tokens sub-blocks per source block): sub-block j
      of the source block interned as b gets id b * k + j.
    - block_tokens is a multiple of 512 (m source blocks per block): each run of m consecutive
      source ids is one block.

    Not frozen: the interning table grows as records are seen (like an id generator).
    """

    __slots__ = ("block_tokens", "source_block_tokens", "_ids")

    def __init__(self, block_tokens: int, source_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> None:
        block_tokens = require_int(block_tokens, 1, "block_tokens")
        src = require_int(source_block_tokens, 1, "source_block_tokens")
        if src % block_tokens and block_tokens % src:
            raise InputError(f"block_tokens must divide {src} or be a multiple of it, got {block_tokens}")
        self.block_tokens = block_tokens
        self.source_block_tokens = src
        self._ids: dict[tuple[int, ...], int] = {}

    def rechunk(self, record: MooncakeRecord) -> tuple[int, ...]:
        """Ids of the full `block_tokens` blocks of the record's prompt, in order."""
        if record.block_tokens != self.source_block_tokens:
            raise InputError(f"a record of {record.block_tokens}-token trace blocks in an id space of "
                             f"{self.source_block_tokens}-token ones")
        if self.block_tokens <= self.source_block_tokens:
            return self._split(record)
        return self._merge(record)

    def _intern(self, key: tuple[int, ...]) -> int:
        got = self._ids.get(key)
        if got is None:
            got = self._ids[key] = len(self._ids)
        return got

    def _split(self, record: MooncakeRecord) -> tuple[int, ...]:
        k = self.source_block_tokens // self.block_tokens
        num_sub = record.input_tokens // self.block_tokens
        out: list[int] = []
        parent = -1  # chain key of the root; interned ids are >= 0
        for src_id in record.block_ids[: math.ceil(num_sub / k)]:
            parent = self._intern((parent, src_id))
            base = parent * k
            out.extend(range(base, base + k))
        return tuple(out[:num_sub])

    def _merge(self, record: MooncakeRecord) -> tuple[int, ...]:
        m = self.block_tokens // self.source_block_tokens
        num_full = record.input_tokens // self.block_tokens
        out: list[int] = []
        parent = -1
        for i in range(num_full):
            parent = self._intern((parent, *record.block_ids[i * m : (i + 1) * m]))
            out.append(parent)
        return tuple(out)


def rechunk(
    record: MooncakeRecord, block_tokens: int, rechunker: Rechunker | None = None
) -> tuple[int, ...]:
    """Convenience for one record; pass a shared `Rechunker` to keep ids comparable across records."""
    if rechunker is None:
        rechunker = Rechunker(block_tokens, record.block_tokens)
    elif rechunker.block_tokens != block_tokens:
        raise ValueError(
            f"rechunker is for {rechunker.block_tokens}-token blocks, not {block_tokens}"
        )
    return rechunker.rechunk(record)


def infer_parents(
    records: tuple[MooncakeRecord, ...] | list[MooncakeRecord],
) -> tuple[int | None, ...]:
    """Index of each request's parent (rule in the module docstring); None starts a conversation.

    Records are taken in the given order (the trace is sorted by timestamp); a parent is always
    an earlier record.
    """
    # Ids are prefix-chained, so a full-block list is found by its last id; the candidate list
    # is still compared in full so that an unchained trace cannot create false parents.
    by_last_full_id: dict[int, list[int]] = {}
    parents: list[int | None] = []
    for i, rec in enumerate(records):
        parents.append(_find_parent(rec, records, by_last_full_id))
        nf = rec.num_full_blocks
        if nf >= _MIN_PARENT_FULL_BLOCKS:
            by_last_full_id.setdefault(rec.block_ids[nf - 1], []).append(i)
    return tuple(parents)


def _find_parent(
    rec: MooncakeRecord,
    records: tuple[MooncakeRecord, ...] | list[MooncakeRecord],
    by_last_full_id: dict[int, list[int]],
) -> int | None:
    ids = rec.block_ids
    # The shared blocks must be full in the child too, so the child's new tokens
    # (input_tokens - 512 * shared blocks) are never negative.
    for length in range(rec.num_full_blocks, _MIN_PARENT_FULL_BLOCKS - 1, -1):
        for cand in reversed(by_last_full_id.get(ids[length - 1], ())):
            c = records[cand]
            if c.num_full_blocks == length and c.block_ids[:length] == ids[:length]:
                return cand
    return None
