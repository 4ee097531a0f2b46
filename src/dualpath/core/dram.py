"""A host-DRAM tier in front of storage (`+dram`, beyond the paper; docs/paper.md §10): per node, Full
Blocks kept in host memory after they crossed it (a read from storage, a persist to it), least
recently used evicted first. A read takes what the tier holds from DRAM and only the rest through the
node's SNIC; the read-side rule sees what each side holds (policy/read_side.py).

`LruBytes` is the ledger both worlds keep per node: entries by key, each with its size in bytes,
at most `capacity_bytes` in all. The runtime's key is a block's digest (one block an entry); the
simulator's a run of one agent's blocks (sim/dram.py). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Hashable


class LruBytes:
    __slots__ = ("capacity_bytes", "used_bytes", "_sizes")

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"a DRAM tier's capacity is non-negative bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._sizes: OrderedDict[Hashable, int] = OrderedDict()  # oldest use first

    def __len__(self) -> int:
        return len(self._sizes)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._sizes

    def touch(self, key: Hashable) -> bool:
        """Mark `key` as used now; False if the tier does not hold it."""
        if key not in self._sizes:
            return False
        self._sizes.move_to_end(key)
        return True

    def put(self, key: Hashable, nbytes: int) -> list[Hashable]:
        """Hold `key` (replacing an entry of that key), evicting the least recently used entries
        until it fits; the keys evicted. An entry larger than the whole tier is not kept."""
        if nbytes < 0:
            raise ValueError(f"an entry's size is non-negative bytes, got {nbytes}")
        self.pop(key)
        if nbytes > self.capacity_bytes:
            return []
        evicted: list[Hashable] = []
        sizes = self._sizes
        while self.used_bytes + nbytes > self.capacity_bytes:
            old, size = sizes.popitem(last=False)
            self.used_bytes -= size
            evicted.append(old)
        sizes[key] = nbytes
        self.used_bytes += nbytes
        return evicted

    def pop(self, key: Hashable) -> int:
        """Drop `key`; its size (0 if not held)."""
        size = self._sizes.pop(key, 0)
        self.used_bytes -= size
        return size

    def check_invariants(self) -> None:
        """The used bytes are the entries' sum, within the capacity."""
        total = sum(self._sizes.values())
        if total != self.used_bytes or total > self.capacity_bytes or min(self._sizes.values(), default=0) < 0:
            raise AssertionError(f"DRAM tier ledger off: {self.used_bytes} used, entries {total}, capacity {self.capacity_bytes}")
