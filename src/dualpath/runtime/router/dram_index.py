"""The router's picture of each engine node's DRAM tier (`+dram`; the tier itself: store/dram_tier.py).

The read-side rule counts what each side's tier holds (core/policy/read_side.py), but the tiers
live in the engines. The router keeps one LRU per node of the same capacity (core.dram.LruBytes),
fed by the same events in the same order as the node's own: the hit blocks it sends a node to
read (`read_sent`), and each block a DE announces it persists (`persisted`, at `PersistQueued`:
the DE's tier takes the block at its copy out of HBM, just after; at `Persisted`, after the slow
write to storage, the model would think a block younger than the tier does, and keep it after the
tier evicted it). It is a model, not a mirror: a read that ends early (a block failing its
checksum) or a tier entry dropped for a bad CRC32 leaves the two apart until the blocks age out. Only the rule's choice depends on it; what
a read takes from DRAM is always the engine's tier's own answer.
"""

from __future__ import annotations

from typing import Sequence

from ...core.dram import LruBytes


class DramIndex:
    def __init__(self, capacity_bytes: int, full_block_bytes: int, block_tokens: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.full_block_bytes = full_block_bytes
        self.block_tokens = block_tokens
        self._nodes: dict[int, LruBytes] = {}

    def _node(self, node: int) -> LruBytes:
        lru = self._nodes.get(node)
        if lru is None:
            lru = self._nodes[node] = LruBytes(self.capacity_bytes)
        return lru

    def read_sent(self, node: int, digests: Sequence[bytes]) -> None:
        lru = self._node(node)
        for d in digests:
            lru.put(d, self.full_block_bytes)

    def persisted(self, node: int, digest: bytes) -> None:
        self._node(node).put(digest, self.full_block_bytes)

    def held_tokens(self, node: int, digests: Sequence[bytes], hit_tokens: int) -> int:
        """Tokens of a hit of `hit_tokens` (its blocks' digests first in `digests`) that `node`'s tier holds."""
        lru = self._nodes.get(node)
        if lru is None or not hit_tokens:
            return 0
        b = self.block_tokens
        held = 0
        for i, d in enumerate(digests[: -(-hit_tokens // b)]):
            if d in lru:
                held += min(hit_tokens, (i + 1) * b) - i * b
        return held

    def engine_lost(self, node: int) -> None:
        """A lost engine's tier is gone with it (its successor starts empty)."""
        self._nodes.pop(node, None)

    def check_invariants(self) -> None:
        for lru in self._nodes.values():
            lru.check_invariants()
