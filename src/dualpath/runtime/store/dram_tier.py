"""An engine node's host-DRAM tier in front of its store (`+dram`; the ledger and the rule: core/dram.py).

Full Blocks by digest, each a private copy with its CRC32, least recently used evicted first
(core.dram.LruBytes). The node's storage client (engine/storage.py) fills it with every block it
read from the store and every block its engine persisted, and asks it first on a read: a block
found here is copied into the read's buffer slot without crossing the SNIC. A block whose CRC32 no
longer matches is dropped and read from the store instead: a stored block that fails its check is
never used, in DRAM as on disk. Thread-safe: the reader and the writer thread share it.

The tier keeps a log of what it came to hold and what it dropped (`drain_changes`): the engine
sends it to the router (`DramChanged`), whose copy of the node's tier (router/dram_index.py) is then
the tier's own contents as of the last report, not a model of them.
"""

from __future__ import annotations

import threading
import zlib

import numpy as np

from ...core.dram import LruBytes


class DramTier:
    def __init__(self, capacity_bytes: int) -> None:
        self._lru = LruBytes(capacity_bytes)
        self._blocks: dict[bytes, tuple[np.ndarray, int]] = {}  # digest -> (its bytes, their CRC32)
        self._lock = threading.Lock()
        self.hits = 0  # blocks a read took from here
        self.bad = 0  # blocks dropped for a CRC32 mismatch (read from the store instead)
        self._changes: dict[bytes, bool] = {}  # since the last drain: digest -> held now (True) or dropped

    def __len__(self) -> int:
        return len(self._blocks)

    def read_into(self, digest: bytes, out: np.ndarray) -> bool:
        """Copy the block into `out` if held and intact (used now); False otherwise."""
        with self._lock:
            got = self._blocks.get(digest)
            if got is None:
                return False
            data, crc = got
            if len(data) != len(out) or zlib.crc32(data) != crc:
                self._drop(digest)
                self.bad += 1
                return False
            self._lru.touch(digest)
            out[:] = data
            self.hits += 1
            return True

    def put(self, digest: bytes, data: np.ndarray, private: bool = False) -> None:
        """Hold the block's bytes (a copy, unless the caller hands over a `private` one)."""
        block = data if private else data.copy()
        crc = zlib.crc32(block)
        with self._lock:
            self._blocks.pop(digest, None)
            for gone in self._lru.put(digest, len(block)):
                del self._blocks[gone]  # type: ignore[arg-type]
                self._changes[gone] = False  # type: ignore[index]
            held = digest in self._lru
            if held:
                self._blocks[digest] = (block, crc)
            self._changes[digest] = held

    def drain_changes(self) -> tuple[list[bytes], list[bytes]]:
        """(held, dropped) since the last drain, each digest by its last change: applied in drain
        order to a copy that started empty (dropped first, then held), they make it hold exactly
        what the tier holds now."""
        with self._lock:
            changes, self._changes = self._changes, {}
        return [d for d, h in changes.items() if h], [d for d, h in changes.items() if not h]

    def digests(self) -> set[bytes]:
        with self._lock:
            return set(self._blocks)

    def clear(self) -> None:
        with self._lock:
            for d in list(self._blocks):
                self._drop(d)

    def _drop(self, digest: bytes) -> None:
        self._lru.pop(digest)
        del self._blocks[digest]
        self._changes[digest] = False

    def check_invariants(self) -> None:
        with self._lock:
            self._lru.check_invariants()
            if len(self._lru) != len(self._blocks) or any(d not in self._lru for d in self._blocks):
                raise AssertionError("DRAM tier: its blocks and its LRU disagree")
