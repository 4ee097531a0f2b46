"""A node's host-DRAM tier as the simulator keeps it (`+dram`; the rule and the ledger: core/dram.py).

Each node holds one tier, chosen once per run (simulator.py): `NO_TIER` without `+dram`; otherwise
the hit model's (hits.py: `HitModel.dram_tier`):
  - `RunTier` (agent trajectories): an entry is a run of one agent's consecutive blocks, so a turn's
    read of 60K tokens is one LRU entry, not a thousand; runs that touch merge, and a run is
    evicted whole (coarser than the runtime's block-by-block LRU: an agent's context is read and
    used as a unit, so its blocks age together); a run larger than the tier keeps its last blocks,
    as a block LRU filled in order would.
  - `BlockTier` (a Mooncake trace): an entry is a block id, as the runtime's digests.
Ranges are in tokens of an agent's prompt (a request id names its agent), [first, last); a tier
holds whole Full Blocks, so a range fills every block it touches and holds the tokens of the
blocks it has.
  1. `held_tokens(agent, first, last, touch)`: tokens of the range in DRAM (`touch`: used now, LRU);
     the read-side rule asks without touching (dispatch.py: SimView.dram_tokens), a read touches
     what it takes (reads.py).
  2. `fill(agent, first, last)`: a read's blocks landed in this node's buffer (reads.py).
  3. `fill_keys(keys)`: blocks a DE persisted from its node's buffer (persists.py).
"""

from __future__ import annotations

from typing import Sequence, cast

from ..core.dram import LruBytes


class NoTier:
    """Without `+dram`: holds nothing."""

    def held_tokens(self, agent: int, first: int, last: int, touch: bool) -> int:
        return 0

    def fill(self, agent: int, first: int, last: int) -> None:
        pass

    def fill_keys(self, keys: Sequence[int]) -> None:
        pass

    def check_invariants(self) -> None:
        pass


NO_TIER = NoTier()


class RunTier(NoTier):
    def __init__(self, capacity_bytes: int, block_tokens: int, block_bytes: int, agent_key_stride: int) -> None:
        self.lru = LruBytes(capacity_bytes)  # key (agent, first block) -> the run's bytes
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.stride = agent_key_stride  # a persisted block's key: agent * stride + block index (hits.py)
        self.runs: dict[int, dict[int, int]] = {}  # agent -> {first block: end block}

    def held_tokens(self, agent: int, first: int, last: int, touch: bool) -> int:
        runs = self.runs.get(agent)
        if not runs or last <= first:
            return 0
        b = self.block_tokens
        held = 0
        for lo, hi in runs.items():
            n = min(last, hi * b) - max(first, lo * b)
            if n > 0:
                held += n
                if touch:
                    self.lru.touch((agent, lo))
        return held

    def fill(self, agent: int, first: int, last: int) -> None:
        if last > first:
            self._fill(agent, first // self.block_tokens, -(-last // self.block_tokens))

    def fill_keys(self, keys: Sequence[int]) -> None:
        i = 0
        while i < len(keys):  # each run of consecutive keys of one agent
            j = i + 1
            while j < len(keys) and keys[j] == keys[j - 1] + 1:
                j += 1
            if keys[i] >= 0:
                agent, lo = divmod(keys[i], self.stride)
                self._fill(agent, lo, lo + j - i)
            i = j

    def _fill(self, agent: int, lo: int, hi: int) -> None:
        runs = self.runs.setdefault(agent, {})
        for f, e in list(runs.items()):  # merge every run it touches
            if f <= hi and e >= lo:
                lo, hi = min(lo, f), max(hi, e)
                del runs[f]
                self.lru.pop((agent, f))
        # a run larger than the tier keeps its last blocks, the ones a block LRU filled in order keeps
        lo = max(lo, hi - self.lru.capacity_bytes // self.block_bytes)
        if lo >= hi:
            if not runs:
                del self.runs[agent]
            return
        runs[lo] = hi
        for gone in self.lru.put((agent, lo), (hi - lo) * self.block_bytes):
            a, f = cast("tuple[int, int]", gone)
            others = self.runs[a]
            del others[f]
            if not others and a != agent:
                del self.runs[a]
        if not runs:
            del self.runs[agent]

    def check_invariants(self) -> None:
        self.lru.check_invariants()
        keys = {(a, f) for a, runs in self.runs.items() for f in runs}
        if len(keys) != len(self.lru) or any(k not in self.lru for k in keys):
            raise AssertionError("DRAM tier: its runs and its LRU disagree")
        for runs in self.runs.values():
            spans = sorted(runs.items())
            if any(hi <= lo for lo, hi in spans) or any(spans[i][1] >= spans[i + 1][0] for i in range(len(spans) - 1)):
                raise AssertionError(f"DRAM tier: runs overlap or touch {spans}")


class BlockTier(NoTier):
    def __init__(self, capacity_bytes: int, block_tokens: int, block_bytes: int, blocks: Sequence[Sequence[int]]) -> None:
        self.lru = LruBytes(capacity_bytes)  # key: a block id
        self.block_tokens = block_tokens
        self.block_bytes = block_bytes
        self.blocks = blocks  # each agent's (request's) block ids, in prompt order

    def held_tokens(self, agent: int, first: int, last: int, touch: bool) -> int:
        b = self.block_tokens
        held = 0
        ids = self.blocks[agent]
        for i in range(first // b, min(len(ids), -(-last // b))):
            if (self.lru.touch(ids[i]) if touch else ids[i] in self.lru):
                held += min(last, (i + 1) * b) - max(first, i * b)
        return held

    def fill(self, agent: int, first: int, last: int) -> None:
        ids = self.blocks[agent]
        b = self.block_tokens
        self.fill_keys(ids[first // b:min(len(ids), -(-last // b))])

    def fill_keys(self, keys: Sequence[int]) -> None:
        for k in keys:
            if k >= 0:  # UNNAMED_BLOCK (hits.py): never looked up
                self.lru.put(k, self.block_bytes)

    def check_invariants(self) -> None:
        self.lru.check_invariants()
