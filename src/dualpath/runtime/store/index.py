"""The store's in-memory index: which blocks exist, their file sizes, recency and pins.

Pure bookkeeping, no I/O and no locking: `BlockStore` holds its lock around every call.

Conservation law (checked by `check_invariants`):
    used_bytes == sum(entry.file_bytes for entry in index)
    used_bytes + reserved_bytes <= capacity_bytes        (when a capacity is set)
where `reserved_bytes` are bytes of writes in flight, claimed before the write starts so that
concurrent writers can never overshoot the capacity together.

Recency: entries are kept least- to most-recently used; `last_access_s` never decreases along
that order. Eviction takes the least recently used entry that is not pinned (a pin is held by
every `read_into` in flight on that entry).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Iterable, Iterator


@dataclass(slots=True)
class IndexEntry:
    digest: bytes
    file_bytes: int
    last_access_s: float
    pins: int = 0


class LruIndex:
    def __init__(self, capacity_bytes: int | None) -> None:
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0 or None, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, IndexEntry] = OrderedDict()
        self.used_bytes = 0
        self.reserved_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, digest: bytes) -> bool:
        return digest in self._entries

    def __iter__(self) -> Iterator[IndexEntry]:
        return iter(list(self._entries.values()))

    def get(self, digest: bytes) -> IndexEntry | None:
        return self._entries.get(digest)

    def lru_order(self) -> tuple[bytes, ...]:
        """Digests from least to most recently used."""
        return tuple(self._entries)

    def add(self, digest: bytes, file_bytes: int, now_s: float) -> IndexEntry:
        """Insert as most recently used. The caller made room first (`victims_for`)."""
        if digest in self._entries:
            raise KeyError(f"block {digest.hex()} already indexed")
        entry = IndexEntry(digest, file_bytes, max(now_s, self._newest_access_s()))
        self._entries[digest] = entry
        self.used_bytes += file_bytes
        return entry

    def remove_if(self, entry: IndexEntry) -> bool:
        """Remove `entry` if it is still the one indexed under its digest (a re-put may have
        replaced it with a fresh entry, which must survive)."""
        if self._entries.get(entry.digest) is not entry:
            return False
        del self._entries[entry.digest]
        self.used_bytes -= entry.file_bytes
        return True

    def touch(self, entry: IndexEntry, now_s: float) -> None:
        if self._entries.get(entry.digest) is entry:
            entry.last_access_s = max(now_s, self._newest_access_s())
            self._entries.move_to_end(entry.digest)

    def touch_chain(self, entries: Iterable[IndexEntry], now_s: float) -> None:
        """Touch a prefix chain tail first, so its head ends most recent: eviction then takes a
        chain's tail before its head (a block is only reachable through every block before it)."""
        for entry in reversed(list(entries)):
            self.touch(entry, now_s)

    def _newest_access_s(self) -> float:
        if not self._entries:
            return float("-inf")
        return self._entries[next(reversed(self._entries))].last_access_s

    def victims_for(self, file_bytes: int) -> list[IndexEntry] | None:
        """Least recently used unpinned entries whose removal makes room for `file_bytes` more
        (on top of the reservations), or None if even evicting every unpinned entry is not enough.
        Nothing is removed here."""
        if self.capacity_bytes is None:
            return []
        excess = self.used_bytes + self.reserved_bytes + file_bytes - self.capacity_bytes
        victims: list[IndexEntry] = []
        for entry in self._entries.values():
            if excess <= 0:
                break
            if entry.pins == 0:
                victims.append(entry)
                excess -= entry.file_bytes
        return victims if excess <= 0 else None

    def check_invariants(self) -> None:
        """Raise AssertionError (also under `python -O`) if a conservation law is broken."""
        total = sum(e.file_bytes for e in self._entries.values())
        _require(total == self.used_bytes, f"used_bytes {self.used_bytes} != sum of entries {total}")
        _require(self.reserved_bytes >= 0, f"reserved_bytes {self.reserved_bytes} < 0")
        if self.capacity_bytes is not None:
            held = self.used_bytes + self.reserved_bytes
            _require(held <= self.capacity_bytes, f"{held} bytes held > capacity {self.capacity_bytes}")
        last = float("-inf")
        for digest, entry in self._entries.items():
            _require(entry.digest == digest, "entry filed under another digest")
            _require(entry.pins >= 0, f"negative pins on {digest.hex()}")
            _require(entry.last_access_s >= last, "LRU order disagrees with last_access_s")
            last = entry.last_access_s


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)
