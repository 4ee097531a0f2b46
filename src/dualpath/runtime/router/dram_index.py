"""The router's copy of each engine node's DRAM tier (`+dram`; the tier itself: store/dram_tier.py).

The read-side rule counts what each side's tier holds (core/policy/read_side.py), but the tiers
live in the engines. Each engine reports its tier's changes (`DramChanged`: the blocks it came to
hold and those it dropped since its last report, in the tier's order), and the router applies them
to a set per node: after each report the set is what the tier held when the report was drained, so
the rule decides by the tier's contents, as the simulator's rule does (sim/dispatch.py), lagging
only by the reports in flight. (A model of the tier kept by the router, an LRU fed with the reads it
sent and the persists announced, drifted from it: the engine fills its tier when a read runs, behind
its read queue, not when the router sends it, so the two evicted different blocks.)

One thing is known before the tier reports it: a block a DE announces it persists (`PersistQueued`,
sent before the token that lets the client send its next turn) enters the DE's tier at its copy out
of HBM, just after; it counts as held from the announcement (`expected`) until a report names it.
Only the rule's choice depends on this copy; what a read takes from DRAM is always the tier's own
answer.
"""

from __future__ import annotations

from typing import Sequence


class DramIndex:
    def __init__(self, capacity_bytes: int, full_block_bytes: int, block_tokens: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.full_block_bytes = full_block_bytes
        self.block_tokens = block_tokens
        self._held: dict[int, set[bytes]] = {}  # node -> what its tier held at its last report
        self._expected: dict[int, set[bytes]] = {}  # node -> announced persists no report has named yet

    def changed(self, node: int, held: Sequence[bytes], dropped: Sequence[bytes]) -> None:
        """A tier's report (`DramChanged`): `dropped` leave the copy, then `held` join it."""
        mine = self._held.setdefault(node, set())
        mine.difference_update(dropped)
        mine.update(held)
        expected = self._expected.get(node)
        if expected:
            expected.difference_update(dropped)
            expected.difference_update(held)

    def persist_queued(self, node: int, digests: Sequence[bytes]) -> None:
        """A DE announced these blocks' persist: its tier takes each at its copy out of HBM."""
        self._expected.setdefault(node, set()).update(digests)

    def holds(self, node: int, digest: bytes) -> bool:
        return digest in self._held.get(node, ()) or digest in self._expected.get(node, ())

    def held_tokens(self, node: int, digests: Sequence[bytes], hit_tokens: int) -> int:
        """Tokens of a hit of `hit_tokens` (its blocks' digests first in `digests`) that `node`'s tier holds."""
        if not hit_tokens or (node not in self._held and node not in self._expected):
            return 0
        b = self.block_tokens
        held = 0
        for i, d in enumerate(digests[: -(-hit_tokens // b)]):
            if self.holds(node, d):
                held += min(hit_tokens, (i + 1) * b) - i * b
        return held

    def engine_lost(self, node: int) -> None:
        """A lost engine's tier is gone with it (its successor starts empty)."""
        self._held.pop(node, None)
        self._expected.pop(node, None)

    def check_invariants(self) -> None:
        """Each copy is what a tier of this capacity held at one moment: it fits."""
        room = self.capacity_bytes // self.full_block_bytes if self.full_block_bytes else 0
        for node, held in self._held.items():
            if len(held) > room:
                raise AssertionError(f"the router's copy of node {node}'s DRAM tier holds {len(held)} blocks, "
                                     f"more than the tier's {room}")
