"""How much of a prompt is already stored: the hit model, chosen once per run by the workload.

The simulator asks it three things, at a turn's hooks (simulator.py), and books the persist
tokens it returns on the DE node's SNIC (`Simulator._persist`):
  1. `hit_tokens(req)`      the DE is chosen (`Simulator.resolve_hit`): the usable hit, in tokens;
  2. `prompt_in_cache(req)` the prompt KV is in the DE's HBM (`Simulator._join`): tokens that
                            start persisting now;
  3. `turn_finished(req)`   the turn's last token (`Simulator._finish`): tokens that start
                            persisting now.

`hit_model_for` picks the model from the workload: agent trajectories get `TrajectoryHits`, a
Mooncake trace (`TraceRequest`s, one-turn agents) gets `StoreHits`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..core.request import TurnSpec, usable_hit_tokens
from ..errors import InputError
from ..workloads.mooncake import MooncakeRecord, Rechunker
from .state import SimRequest


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
    def hit_tokens(self, req: SimRequest) -> int:
        raise NotImplementedError

    def prompt_in_cache(self, req: SimRequest) -> int:
        raise NotImplementedError

    def turn_finished(self, req: SimRequest) -> int:
        raise NotImplementedError


class TrajectoryHits(HitModel):
    """The hit is every full block of the agent's earlier turns, as the paper's client computes it
    (PAPER.md 1.5, A.4: hits within a trajectory, nothing evicted, agents share nothing). A turn's
    new full blocks (context + generation) persist when it finishes; the few ms by which the last
    block's write may trail the next turn's lookup are not modelled as a miss."""

    def __init__(self, block_tokens: int) -> None:
        self.block_tokens = block_tokens

    def hit_tokens(self, req: SimRequest) -> int:
        return usable_hit_tokens(req.agent.context_tokens, req.input_tokens, self.block_tokens)

    def prompt_in_cache(self, req: SimRequest) -> int:
        return 0

    def turn_finished(self, req: SimRequest) -> int:
        """Call after `agent.context_tokens` counts this turn's generation."""
        agent = req.agent
        b = self.block_tokens
        durable = agent.context_tokens // b * b
        new_tokens = durable - agent.persisted_tokens
        agent.persisted_tokens = max(agent.persisted_tokens, durable)
        return new_tokens


class StoreHits(HitModel):
    """A simulated KV store of block ids, as the runtime's store sees a replayed trace.

    - Ids: each request's 512-token ids rechunked to the cluster's `block_tokens`, full blocks
      only, by one `Rechunker` per run in request order. They stand for the runtime's chained
      block digests of the replayed prompt (`replay_mooncake` gives every 512-token id fixed
      tokens; `core.blocks.chain_digests` chains the blocks).
    - Hit: the longest stored prefix of the prompt's full blocks, then `usable_hit_tokens`
      (`runtime/router/placement.py:Placement.lookup` and `hit_tokens`).
    - Visible: a prompt's full blocks count as stored from the instant the DE has copied the prompt
      KV into its cache. That is when the runtime's DE announces their persist
      (`runtime/engine/decode.py:DecodeEngine._copy_done` -> `_persist_full_blocks`, `PersistQueued`),
      and from then on a lookup whose next block is among them waits for the write
      (`runtime/router/router.py:Router._wait_for_persist`, `Placement.blocked_by_persist`). The
      write's own few ms and the router's `persist_wait_s` give-up are not modelled. A one-token
      turn skips the simulated H2D copy (`Simulator.kv_landed`): its blocks become visible when
      it finishes, that same instant.
    - Persist tokens, as `_persist_full_blocks` writes them: at the copy, every prompt full block
      beyond the hit (an already stored one is written again); at the finish, the generated
      blocks that filled, (input + gen - 1) // b - input // b (the last token's KV is never
      computed). Generated blocks are never looked up: a trace prompt's tokens come from its
      block ids, never from a model's output.
    - Nothing is evicted (the runtime's store is unbounded unless `store_capacity_bytes` is set).
    """

    def __init__(self, requests: Sequence[TraceRequest], block_tokens: int) -> None:
        rechunker = Rechunker(block_tokens, requests[0].record.block_tokens if requests else 512)  # one id space per run
        self.block_tokens = block_tokens
        self.blocks: list[tuple[int, ...]] = [rechunker.rechunk(r.record) for r in requests]  # by agent id
        self.stored: set[int] = set()
        self._in_cache: set[int] = set()  # agents (one turn each) whose prompt blocks are visible

    def stored_prefix_blocks(self, agent: int) -> int:
        blocks = self.blocks[agent]
        n = 0
        while n < len(blocks) and blocks[n] in self.stored:
            n += 1
        return n

    def hit_tokens(self, req: SimRequest) -> int:
        b = self.block_tokens
        return usable_hit_tokens(self.stored_prefix_blocks(req.rid.agent) * b, req.input_tokens, b)

    def prompt_in_cache(self, req: SimRequest) -> int:
        aid = req.rid.agent
        blocks = self.blocks[aid]
        self.stored.update(blocks)
        self._in_cache.add(aid)
        return (len(blocks) - req.hit_tokens // self.block_tokens) * self.block_tokens

    def turn_finished(self, req: SimRequest) -> int:
        aid = req.rid.agent
        prompt = 0 if aid in self._in_cache else self.prompt_in_cache(req)
        self._in_cache.discard(aid)
        b = self.block_tokens
        generated = (req.input_tokens + req.gen_tokens - 1) // b - req.input_tokens // b
        return prompt + generated * b


def hit_model_for(workload: Sequence[Any], block_tokens: int) -> HitModel:
    """`StoreHits` for a Mooncake trace (every item a `TraceRequest`), else `TrajectoryHits`."""
    num_trace = sum(1 for w in workload if isinstance(w, TraceRequest))
    if num_trace == 0:
        return TrajectoryHits(block_tokens)
    if num_trace != len(workload):
        raise InputError("a workload is either agent trajectories or one Mooncake trace, not a mix")
    return StoreHits(workload, block_tokens)
