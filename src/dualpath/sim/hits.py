"""How much of a prompt is already stored: the hit model, chosen once per run by the workload.

A hit model tracks blocks by key: queued for persist (in flight) or written (stored), as the
runtime's router does (`runtime/router/placement.py`: `persisting`, the store's index). The
simulator asks it, at a turn's hooks (simulator.py, persists.py):
  1. `hit_tokens(req)`        the DE is chosen: the usable hit, counting in-flight blocks as
                              stored (`Placement.lookup`: placement waits for them);
  2. `stored_hit_tokens(req)`, `blocked_by_persist(req)`  at placement (persists.py:
                              `PlacementGate`, as `Router._try_place`);
  3. `prompt_in_cache(req)`   the prompt KV is in the DE's HBM (`Simulator._join`): the keys of
                              the blocks that start persisting now;
  4. `turn_finished(req)`     the turn's last token (`Simulator._finish`): the same, for the
                              blocks the generation filled;
  5. `written(key)`           a block's write ended (persists.py: `PersistWrites`); or, where a
                              write takes no time (`instant_writes`), `stored_now(keys)` as they
                              are queued.
A key is an int; `UNNAMED_BLOCK` is a block that is written but never looked up.

The blocks a DE persists are the runtime's (`runtime/engine/decode.py:_persist_full_blocks`):
at the copy, the prompt's full blocks beyond the hit; then each block whose every position has
KV, so a turn's last full block counts only up to its last token but one (that token's KV is
computed by the next turn; the `local` preset's rule, the paper presets count the whole context,
docs/paper.md §1.5). The runtime queues each generated block as it fills; the simulator names them
when the turn finishes and persists.py writes them from the times they filled.

`hit_model_for` picks the model from the workload: agent trajectories get `TrajectoryHits`, a
Mooncake trace (`TraceRequest`s, one-turn agents) gets `StoreHits`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..core.request import TurnSpec, usable_hit_tokens
from ..errors import InputError
from ..workloads.mooncake import MooncakeRecord, Rechunker
from .dram import BlockTier, NoTier, RunTier
from .state import SimRequest

UNNAMED_BLOCK = -1  # a block that is written (it costs SNIC time) but never looked up
_AGENT_KEY_BITS = 24  # TrajectoryHits keys: agent << bits | block index (2^24 blocks an agent)
_AGENT_KEY_STRIDE = 1 << _AGENT_KEY_BITS
_BLOCK_INDEX_MASK = _AGENT_KEY_STRIDE - 1


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """A Mooncake record as a one-turn agent: it sends `input_tokens` and generates
    max(1, output_tokens) (`runtime/apps/replay.py:replay_mooncake` asks for as many)."""

    record: MooncakeRecord
    turns: tuple[TurnSpec, ...]  # the one turn: (input_tokens, max(1, output_tokens))

    @classmethod
    def of(cls, record: MooncakeRecord) -> TraceRequest:
        return cls(record, (TurnSpec(record.input_tokens, max(1, record.output_tokens)),))


class HitModel:
    def __init__(self, block_tokens: int, instant_writes: bool = False) -> None:
        self.block_tokens = block_tokens
        # A write ends the moment it is queued (persists.py: untimed, the paper presets and the
        # oracle): nothing is ever in flight, so no key enters `persisting` and the writer stores
        # each turn's keys with one `stored_now`.
        self.instant_writes = instant_writes
        self.persisting: dict[int, int] = {}  # key -> writes queued and not yet ended
        self._in_cache: set[int] = set()  # agents whose turn's prompt blocks are queued (`prompt_in_cache`)

    def _queue(self, keys: list[int]) -> list[int]:
        if self.instant_writes:
            return keys
        for k in keys:
            if k != UNNAMED_BLOCK:
                self.persisting[k] = self.persisting.get(k, 0) + 1
        return keys

    def written(self, key: int) -> None:
        if key == UNNAMED_BLOCK:
            return
        left = self.persisting.pop(key) - 1
        if left:
            self.persisting[key] = left
        self._stored(key)

    def stored_now(self, keys: list[int]) -> None:
        """Keys just queued, written at once (`instant_writes`): the same as each one's `written`."""
        assert self.instant_writes
        for k in keys:
            if k != UNNAMED_BLOCK:
                self._stored(k)

    def _stored(self, key: int) -> None:
        raise NotImplementedError

    def _prefix_blocks(self, req: SimRequest, in_flight: bool) -> tuple[int, int]:
        """(blocks of the prompt's stored prefix, the key after it or UNNAMED_BLOCK)."""
        raise NotImplementedError

    def _usable(self, blocks: int, req: SimRequest) -> int:
        return usable_hit_tokens(blocks * self.block_tokens, req.input_tokens, self.block_tokens)

    def hit_tokens(self, req: SimRequest) -> int:
        return self._usable(self._prefix_blocks(req, True)[0], req)

    def stored_hit_tokens(self, req: SimRequest) -> int:
        return self._usable(self._prefix_blocks(req, False)[0], req)

    def blocked_by_persist(self, req: SimRequest) -> bool:
        """The block after the stored prefix is in flight, within the usable part of the prompt."""
        blocks, nxt = self._prefix_blocks(req, False)
        usable = (req.input_tokens - 1) // self.block_tokens
        return blocks < usable and nxt in self.persisting

    def prompt_in_cache(self, req: SimRequest) -> list[int]:
        raise NotImplementedError

    def turn_finished(self, req: SimRequest) -> list[int]:
        raise NotImplementedError

    def dram_tier(self, capacity_bytes: int, block_bytes: int) -> NoTier:
        """A node's DRAM tier over this model's keys (`+dram`, dram.py)."""
        raise NotImplementedError

    def generated_key(self, req: SimRequest, index: int) -> int:
        """The key of block `index` of `req`'s sequence, one its generation fills (what `turn_finished`
        returns for it); UNNAMED_BLOCK if no later turn can name it."""
        raise NotImplementedError


class TrajectoryHits(HitModel):
    """Hits within a trajectory, as the paper's client computes them (docs/paper.md §1.5, the paper's A.4): a turn
    hits every block of the agent's earlier turns that is queued or written; nothing is evicted;
    agents share nothing. Keys: agent * 2^24 + block index. `last_token_next_turn`: the runtime's
    rule, a turn's last token has no KV until the next turn computes it, so the block it ends is
    written then (the `local` preset); False, the paper's client: the whole earlier context."""

    def __init__(self, block_tokens: int, last_token_next_turn: bool = False, instant_writes: bool = False) -> None:
        super().__init__(block_tokens, instant_writes)
        self.last_token_next_turn = last_token_next_turn
        self._written: dict[int, set[int]] = {}  # agent -> written block indices past its prefix
        self._written_prefix: dict[int, int] = {}  # agent -> blocks 0.. all written

    def written(self, key: int) -> None:
        """`HitModel.written` with `_stored` inlined (a call per persisted block)."""
        if key == UNNAMED_BLOCK:
            return
        persisting = self.persisting
        left = persisting.pop(key) - 1
        if left:
            persisting[key] = left
        aid, index = key >> _AGENT_KEY_BITS, key & _BLOCK_INDEX_MASK
        if index == self._written_prefix.get(aid, -1) and not self._written.get(aid):
            self._written_prefix[aid] = index + 1  # the block after the prefix, nothing written past it
            return
        self._stored(key)

    def stored_now(self, keys: list[int]) -> None:
        """`HitModel.stored_now` for one agent's consecutive blocks (what `_persist` queues): the
        written prefix moves to their end in one step when they start at or before it and nothing
        is written past it; else block by block."""
        assert self.instant_writes
        if not keys:
            return
        first = keys[0]
        aid, lo = first >> _AGENT_KEY_BITS, first & _BLOCK_INDEX_MASK
        hi = lo + len(keys)
        n = self._written_prefix.get(aid, 0)
        if lo <= n and keys[-1] == first + len(keys) - 1 and not self._written.get(aid):
            if hi > n:
                self._written_prefix[aid] = hi
            return
        for k in keys:
            self._stored(k)

    def _stored(self, key: int) -> None:
        aid, index = key >> _AGENT_KEY_BITS, key & _BLOCK_INDEX_MASK
        n = self._written_prefix.get(aid, 0)
        if index < n:  # written again (a short hit left it out): the prefix holds it already
            return
        done = self._written.get(aid)
        if index == n:  # the block after the prefix (blocks are mostly written in order): no set entry
            n += 1
            if done:
                while n in done:
                    done.discard(n)
                    n += 1
            self._written_prefix[aid] = n
            return
        if done is None:
            done = self._written[aid] = set()
        done.add(index)
        while n in done:
            done.discard(n)
            n += 1
        self._written_prefix[aid] = n

    def _prefix_blocks(self, req: SimRequest, in_flight: bool) -> tuple[int, int]:
        agent = req.agent
        queued = agent.persisted_tokens // self.block_tokens
        n = queued if in_flight else self._written_prefix.get(agent.aid, 0)
        return n, (agent.aid * _AGENT_KEY_STRIDE + n if n < queued else UNNAMED_BLOCK)

    def _persist(self, req: SimRequest, first: int, last: int) -> list[int]:
        agent = req.agent
        last_tokens = last * self.block_tokens
        if last_tokens > agent.persisted_tokens:
            agent.persisted_tokens = last_tokens
        return self._queue([agent.aid * _AGENT_KEY_STRIDE + i for i in range(first, last)])

    def dram_tier(self, capacity_bytes: int, block_bytes: int) -> NoTier:
        return RunTier(capacity_bytes, self.block_tokens, block_bytes, _AGENT_KEY_STRIDE)

    def generated_key(self, req: SimRequest, index: int) -> int:
        return req.agent.aid * _AGENT_KEY_STRIDE + index

    def prompt_in_cache(self, req: SimRequest) -> list[int]:
        """The prompt's full blocks beyond the hit (blocks a short hit left out are written again)."""
        b = self.block_tokens
        self._in_cache.add(req.agent.aid)
        return self._persist(req, req.hit_tokens // b, req.input_tokens // b)

    def turn_finished(self, req: SimRequest) -> list[int]:
        """The blocks the generation filled; with them, for a turn that ended at its first token
        (simulator.py: it never joins a DE's batch, so `prompt_in_cache` never ran), its prompt's
        blocks beyond the hit, as the runtime's DE persists them at the H2D copy that it still makes."""
        b = self.block_tokens
        aid = req.agent.aid
        first = req.input_tokens // b if aid in self._in_cache else req.hit_tokens // b
        self._in_cache.discard(aid)
        last_kv = req.input_tokens + req.gen_tokens - (1 if self.last_token_next_turn else 0)
        return self._persist(req, first, last_kv // b)


class StoreHits(HitModel):
    """A simulated KV store of block ids, as the runtime's store sees a replayed trace.

    - Ids: each request's 512-token ids rechunked to the cluster's `block_tokens`, full blocks
      only, by one `Rechunker` per run in request order. They stand for the runtime's chained
      block digests of the replayed prompt (`replay_mooncake` gives every 512-token id fixed
      tokens; `core.blocks.chain_digests` chains the blocks).
    - Hit: the longest prefix of the prompt's full blocks that is stored or in flight, then
      `usable_hit_tokens` (`Placement.lookup` and `hit_tokens`).
    - Generated blocks are written (`UNNAMED_BLOCK`) but never looked up: a trace prompt's
      tokens come from its block ids, never from a model's output.
    - A one-token turn skips the simulated H2D copy (`Simulator.kv_landed`): its prompt blocks
      are queued when it finishes, that same instant.
    - Nothing is evicted (the runtime's store is unbounded unless `store_capacity_bytes` is set).
    """

    def __init__(self, requests: Sequence[TraceRequest], block_tokens: int, instant_writes: bool = False) -> None:
        super().__init__(block_tokens, instant_writes)
        rechunker = Rechunker(block_tokens, requests[0].record.block_tokens if requests else 512)  # one id space per run
        self.blocks: list[tuple[int, ...]] = [rechunker.rechunk(r.record) for r in requests]  # by agent id
        self.stored: set[int] = set()

    def _stored(self, key: int) -> None:
        self.stored.add(key)

    def _prefix_blocks(self, req: SimRequest, in_flight: bool) -> tuple[int, int]:
        blocks = self.blocks[req.rid.agent]
        n = 0
        while n < len(blocks) and (blocks[n] in self.stored or (in_flight and blocks[n] in self.persisting)):
            n += 1
        return n, (blocks[n] if n < len(blocks) else UNNAMED_BLOCK)

    def dram_tier(self, capacity_bytes: int, block_bytes: int) -> NoTier:
        return BlockTier(capacity_bytes, self.block_tokens, block_bytes, self.blocks)

    def generated_key(self, req: SimRequest, index: int) -> int:
        return UNNAMED_BLOCK  # a trace request's generated blocks: no later request names them

    def prompt_in_cache(self, req: SimRequest) -> list[int]:
        aid = req.rid.agent
        self._in_cache.add(aid)
        return self._queue(list(self.blocks[aid][req.hit_tokens // self.block_tokens:]))

    def turn_finished(self, req: SimRequest) -> list[int]:
        aid = req.rid.agent
        prompt = [] if aid in self._in_cache else self.prompt_in_cache(req)
        self._in_cache.discard(aid)
        b = self.block_tokens
        generated = (req.input_tokens + req.gen_tokens - 1) // b - req.input_tokens // b
        return prompt + [UNNAMED_BLOCK] * generated


def hit_model_for(workload: Sequence[Any], block_tokens: int, runtime_rule: bool = False,
                  instant_writes: bool = False) -> HitModel:
    """`StoreHits` for a Mooncake trace (every item a `TraceRequest`), else `TrajectoryHits`
    (`runtime_rule`: the runtime's last-token rule, `TrajectoryHits.last_token_next_turn`);
    `instant_writes`: `HitModel.instant_writes`."""
    num_trace = sum(1 for w in workload if isinstance(w, TraceRequest))
    if num_trace == 0:
        return TrajectoryHits(block_tokens, runtime_rule, instant_writes)
    if num_trace != len(workload):
        raise InputError("a workload is either agent trajectories or one Mooncake trace, not a mix")
    return StoreHits(workload, block_tokens, instant_writes)
