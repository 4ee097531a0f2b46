"""Placement (router step 3): a request's hit in the KV store and its host-buffer regions.

Pure bookkeeping over the store index and the nodes' host buffers; the router decides when.
  1. `lookup`: the prompt's chained block digests and how many lead blocks are stored.
  2. `blocked_by_persist`: the block after the stored prefix is still being written by a DE
     (`PersistQueued` .. `Persisted`), so a lookup now would miss what the turn will soon hit.
  3. `allocate_regions`: one slot per prompt block in the DE node's buffer (always: the prompt
     KV lands there), and on the PE read path one per block in the PE node's buffer too; all or
     nothing.
"""

from __future__ import annotations

from typing import Any

from ...core.blocks import chain_digests
from ...core.request import usable_hit_tokens
from ...core.snapshot import ReadSide
from ..transport.shm import BufferFull, HostBuffer, ShmRegion


class Placement:
    def __init__(self, store: Any, buffers: dict[int, HostBuffer], block_tokens: int) -> None:
        self.store = store
        self.buffers = buffers
        self.block_tokens = block_tokens
        self.persisting: dict[bytes, int] = {}  # digest -> writes queued on a DE and not yet ended

    # 1. hit
    def lookup(self, prompt: list[int]) -> tuple[list[bytes], int]:
        """(the prompt's block digests, the usable hit in tokens) as the scheduling pass counts it:
        a block whose persist is in flight counts as stored, since placement waits for it
        (`blocked_by_persist`) and so reads it; placement corrects the count if a write fails."""
        digests = chain_digests(prompt, self.block_tokens)
        n = self.store.lookup(digests)
        while n < len(digests) and digests[n] in self.persisting:
            n += 1 + self.store.lookup(digests[n + 1:])
        return digests, self.hit_tokens(prompt, n)

    def hit_tokens(self, prompt: list[int], stored_blocks: int) -> int:
        """The usable hit of a prompt whose first `stored_blocks` blocks are stored."""
        return usable_hit_tokens(stored_blocks * self.block_tokens, len(prompt), self.block_tokens)

    # 2. persists in flight
    def persist_queued(self, digests: list[bytes]) -> None:
        for d in digests:
            self.persisting[d] = self.persisting.get(d, 0) + 1

    def persisted(self, digest: bytes) -> None:
        left = self.persisting.pop(digest, 0) - 1
        if left > 0:
            self.persisting[digest] = left

    def blocked_by_persist(self, prompt: list[int], digests: list[bytes], stored_blocks: int) -> bool:
        usable = (len(prompt) - 1) // self.block_tokens  # the hit leaves a token to compute
        return stored_blocks < min(usable, len(digests)) and digests[stored_blocks] in self.persisting

    # 3. buffers
    def allocate_regions(self, pe_node: int, de_node: int, num_tokens: int,
                         side: ReadSide) -> tuple[list[ShmRegion], list[ShmRegion]] | None:
        """(DE regions, PE regions) for a prompt of `num_tokens`, or None (nothing held) when a
        buffer lacks room."""
        nblocks = -(-num_tokens // self.block_tokens)
        try:
            de_regions = self._allocate(de_node, nblocks)
        except BufferFull:
            return None
        pe_regions: list[ShmRegion] = []
        if side is ReadSide.PREFILL:
            try:
                pe_regions = self._allocate(pe_node, nblocks)
            except BufferFull:
                self.free(de_node, de_regions)
                return None
        return de_regions, pe_regions

    def _allocate(self, node: int, nblocks: int) -> list[ShmRegion]:
        buf = self.buffers[node]
        if buf.num_free_slots < nblocks:
            raise BufferFull(f"node {node}: {buf.num_free_slots} free slots, {nblocks} needed")
        return [buf.allocate() for _ in range(nblocks)]

    def free(self, node: int, regions: list[ShmRegion]) -> None:
        for r in regions:
            self.buffers[node].free(r)

    def check_invariants(self) -> None:
        for buf in self.buffers.values():
            buf.check_invariants()
        if any(n <= 0 for n in self.persisting.values()):
            raise AssertionError("a persist count is not positive")
