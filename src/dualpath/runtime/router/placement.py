"""Placement (router step 3): a request's hit in the KV store and its host-buffer regions.

Pure bookkeeping over the store index and the nodes' host buffers; the router decides when.
  1. `lookup`: the prompt's chained block digests and how many lead blocks are stored.
  2. `blocked_by_persist`: the block after the stored prefix is still being written by a DE
     (`PersistQueued` .. `Persisted`), so a lookup now would miss what the turn will soon hit.
  3. `allocate_regions`: one slot per prompt block in the DE node's buffer (always: the prompt
     KV lands there), and on the PE read path one per block in the PE node's buffer too (a split
     read: one per block of its PE part); all or nothing.
  4. `engine_lost`: a dead DE's writes never report; its blocks stop blocking placement.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable, Sequence

from ...core.blocks import chain_digests, salted_root
from ...core.request import usable_hit_tokens
from ...core.snapshot import ReadSide
from ..transport.shm import BufferFull, HostBuffer, ShmRegion
from .dram_index import DramIndex


class Placement:
    def __init__(self, store: Any, buffers: dict[int, HostBuffer], block_tokens: int) -> None:
        self.store = store
        self.buffers = buffers
        self.block_tokens = block_tokens
        self.persisting: dict[bytes, int] = {}  # digest -> writes queued on a DE and not yet ended
        self.dram: DramIndex | None = None  # the router's copy of each node's DRAM tier (`+dram`; the router sets it)
        self._persisting_on: dict[int, Counter[bytes]] = {}  # the same, per DE that queued them

    # 1. hit
    def digests(self, prompt: Sequence[int], salt: str = "") -> list[bytes]:
        """The prompt's chained block digests (the store's keys) under its cache salt, computed
        once per request."""
        return chain_digests(prompt, self.block_tokens, salted_root(salt))

    def lookup(self, prompt: Sequence[int], digests: list[bytes]) -> int:
        """The usable hit in tokens as the scheduling pass counts it: a block whose persist is in
        flight counts as stored, since placement waits for it (`blocked_by_persist`) and so reads
        it; placement corrects the count if a write fails. No side effects."""
        n = self.store.lookup(digests)
        while n < len(digests) and digests[n] in self.persisting:
            n += 1 + self.store.lookup(digests[n + 1:])
        return self.hit_tokens(prompt, n)

    def hit_tokens(self, prompt: Sequence[int], stored_blocks: int) -> int:
        """The usable hit of a prompt whose first `stored_blocks` blocks are stored."""
        return usable_hit_tokens(stored_blocks * self.block_tokens, len(prompt), self.block_tokens)

    # 2. persists in flight
    def persist_queued(self, digests: list[bytes], engine: int = -1) -> None:
        for d in digests:
            self.persisting[d] = self.persisting.get(d, 0) + 1
        self._persisting_on.setdefault(engine, Counter()).update(digests)

    def persisted(self, digest: bytes, engine: int = -1, times: int = 1) -> None:
        left = self.persisting.pop(digest, 0) - times
        if left > 0:
            self.persisting[digest] = left
        mine = self._persisting_on.get(engine)
        if mine is not None:
            mine[digest] -= times
            if mine[digest] <= 0:
                del mine[digest]

    # 4. a dead DE
    def engine_lost(self, engine: int) -> None:
        """Drop the dead `engine`'s queued writes: they will never report `Persisted`; and its DRAM tier."""
        if self.dram is not None:
            self.dram.engine_lost(engine)
        for digest, n in list(self._persisting_on.pop(engine, Counter()).items()):
            self.persisted(digest, engine, n)

    def persisting_on(self, engine: int) -> set[bytes]:
        """The digests whose writes `engine` queued and that have not ended."""
        return {d for d, n in self._persisting_on.get(engine, {}).items() if n > 0}

    def blocked_by_persist(self, prompt: list[int], digests: list[bytes], stored_blocks: int) -> bool:
        usable = (len(prompt) - 1) // self.block_tokens  # the hit leaves a token to compute
        return stored_blocks < min(usable, len(digests)) and digests[stored_blocks] in self.persisting

    def wait_for_persist(self, rr: Any, prompt: list[int], stored: int, now_s: float, wait_s: float,
                         on_first_wait: Callable[[], Any]) -> bool:
        """True while the block after the stored prefix of `rr` (a RouterRequest) is still being
        written by a DE (docs/paper.md §1.5: a turn hits the client's whole earlier context). `Persisted`
        kicks the next pass; after `wait_s` the request goes on with what is stored (a write that
        never reports); `on_first_wait` arranges a pass for then."""
        if not self.blocked_by_persist(prompt, rr.digests, stored):
            return False
        if rr.persist_wait_since_s is None:
            rr.persist_wait_since_s = now_s
            on_first_wait()
        return now_s - rr.persist_wait_since_s < wait_s

    # 3. buffers
    def allocate_regions(self, pe_node: int, de_node: int, num_tokens: int, side: ReadSide,
                         pe_part_tokens: int = 0) -> tuple[list[ShmRegion], list[ShmRegion]] | None:
        """(DE regions, PE regions) for a prompt of `num_tokens`, or None (nothing held) when a
        buffer lacks room. The PE node holds the whole prompt on the PE path (later chunks reload
        earlier ones from it), a split read's PE part (`pe_part_tokens`) on the DE path."""
        nblocks = -(-num_tokens // self.block_tokens)
        pe_blocks = nblocks if side is ReadSide.PREFILL else -(-pe_part_tokens // self.block_tokens)
        try:
            de_regions = self._allocate(de_node, nblocks)
        except BufferFull:
            return None
        pe_regions: list[ShmRegion] = []
        if pe_blocks:
            try:
                pe_regions = self._allocate(pe_node, pe_blocks)
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

    def release_de_regions(self, rr: Any) -> None:
        """A RouterRequest's DE-buffer regions, once neither engine touches them: its DE has let it
        go (DecodeDone) and its PE has written the prompt's KV into them for the last time
        (PrefillDone). A region freed while a cancelled request's PE still writes into it could be
        given to another request and overwritten under it. (A loaded prompt's are freed at
        PromptLoaded: the PE's writes all landed before its PromptReady.)"""
        if rr.de_regions and rr.pe_done and rr.de_done:
            self.free(rr.de.engine, rr.de_regions)
            rr.de_regions = []

    def check_invariants(self) -> None:
        for buf in self.buffers.values():
            buf.check_invariants()
        if any(n <= 0 for n in self.persisting.values()):
            raise AssertionError("a persist count is not positive")
        if self.dram is not None:
            self.dram.check_invariants()
