"""A node's host buffer in shared memory, cut into fixed-size slots.

Lifecycle:
1. The owning process `HostBuffer.create(slot_bytes, num_slots)`: one POSIX shared-memory
   segment, every slot free.
2. The owner `allocate(nbytes)`s a slot and gets a `ShmRegion(segment, offset_bytes, nbytes)`,
   the address any process on the host can use. (The router allocates from a `SlotLedger` of the
   same shape, built from the owning engine's Hello: the bookkeeping without the memory.)
3. Any process (the owner included) reads or writes the bytes through `view(region)`; other
   processes attach by name through `SharedSegments` (the stand-in for RDMA memory registration).
4. The owner `free(region)`s the slot when the bytes are consumed.
5. `close()` drops this process's mapping; the owner's `close()` also unlinks the segment: the
   name disappears at once, other processes' mappings stay valid until they close them.

Views are numpy uint8 arrays on the mapping: drop them before `close()` (the mapping cannot be
unmapped while a view exists; `close` raises `BufferError` then).

Conservation (check_invariants): free slots + used slots = num_slots, disjoint.
POSIX shared memory only (Linux is what the runtime targets).
"""

from __future__ import annotations

import mmap
import os
import threading
from dataclasses import dataclass
from multiprocessing import shared_memory

import _posixshmem  # the POSIX shm_open that multiprocessing.shared_memory uses
import numpy as np

_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux >= 5.14


class BufferFull(RuntimeError):
    """No free slot in a host buffer."""


@dataclass(frozen=True, slots=True)
class ShmRegion:
    """Bytes [offset_bytes, offset_bytes + nbytes) of shared-memory segment `segment`."""

    segment: str
    offset_bytes: int
    nbytes: int


def _prefault(m: mmap.mmap | None) -> None:
    """Map every page now, writable, so the first copy does not pay page faults (RDMA
    registration pins pages the same way). Best effort: older kernels just fault lazily."""
    if m is None or not hasattr(m, "madvise"):
        return
    try:
        m.madvise(_MADV_POPULATE_WRITE)
    except OSError:
        pass


class SlotLedger:
    """Which slots of a segment are in use: the bookkeeping half of a host buffer, kept apart from
    its memory so that the router can allocate slots of a buffer that lives in another process
    (or, across hosts, on another machine: the engine that owns it reports its name and shape in
    its Hello). Conservation (check_invariants): free + used = num_slots, disjoint."""

    def __init__(self, name: str, slot_bytes: int, num_slots: int) -> None:
        if slot_bytes <= 0 or num_slots <= 0:
            raise ValueError(f"slot_bytes and num_slots must be positive, got {slot_bytes} and {num_slots}")
        self.name = name
        self.slot_bytes = slot_bytes
        self.num_slots = num_slots
        self._lock = threading.Lock()
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out slot 0 first
        self._used: set[int] = set()

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    @property
    def num_used_slots(self) -> int:
        return len(self._used)

    def allocate(self, nbytes: int | None = None) -> ShmRegion:
        """A free slot; the region covers its first `nbytes` (default: the whole slot)."""
        n = self.slot_bytes if nbytes is None else nbytes
        if not 0 < n <= self.slot_bytes:
            raise ValueError(f"nbytes must be in (0, {self.slot_bytes}], got {n}")
        with self._lock:
            if not self._free:
                raise BufferFull(f"host buffer {self.name}: all {self.num_slots} slots in use")
            slot = self._free.pop()
            self._used.add(slot)
        return ShmRegion(self.name, slot * self.slot_bytes, n)

    def free(self, region: ShmRegion) -> None:
        slot = self._slot_of(region)
        with self._lock:
            if slot not in self._used:
                raise ValueError(f"slot {slot} of {self.name} is not allocated (double free?)")
            self._used.remove(slot)
            self._free.append(slot)

    def check_invariants(self) -> None:
        with self._lock:
            free = set(self._free)
            assert len(free) == len(self._free), "a slot is free twice"
            assert not free & self._used, "a slot is both free and used"
            assert len(free) + len(self._used) == self.num_slots, "slots were lost or invented"
            assert all(0 <= s < self.num_slots for s in free | self._used), "slot index out of range"

    def _slot_of(self, region: ShmRegion) -> int:
        if region.segment != self.name:
            raise ValueError(f"region is in segment {region.segment!r}, not {self.name!r}")
        slot, rem = divmod(region.offset_bytes, self.slot_bytes)
        if rem or not 0 <= slot < self.num_slots:
            raise ValueError(f"offset {region.offset_bytes} is not the start of a slot of {self.name}")
        return slot


class HostBuffer(SlotLedger):
    """Owner of one segment of `num_slots` slots of `slot_bytes` each, with its own ledger."""

    def __init__(self, shm: shared_memory.SharedMemory, slot_bytes: int, num_slots: int) -> None:
        super().__init__(shm.name, slot_bytes, num_slots)
        self._shm = shm
        self._array = np.frombuffer(shm.buf, dtype=np.uint8, count=slot_bytes * num_slots)
        self._closed = False

    @classmethod
    def create(cls, slot_bytes: int, num_slots: int, name: str | None = None, prefault: bool = True) -> "HostBuffer":
        if slot_bytes <= 0 or num_slots <= 0:
            raise ValueError(f"slot_bytes and num_slots must be positive, got {slot_bytes} and {num_slots}")
        # The creator registers the segment with multiprocessing's resource tracker, which
        # unlinks it if the process tree dies without `close()`.
        shm = shared_memory.SharedMemory(name=name, create=True, size=slot_bytes * num_slots)
        if prefault:
            _prefault(getattr(shm, "_mmap", None))
        return cls(shm, slot_bytes, num_slots)

    def view(self, region: ShmRegion) -> np.ndarray:
        """Writable uint8 view of the region's bytes."""
        if region.segment != self.name:
            raise ValueError(f"region is in segment {region.segment!r}, not {self.name!r}")
        return _slice(self._array, region)

    def close(self) -> None:
        """Unlink the segment (its name disappears) and unmap it from this process."""
        if self._closed:
            return
        self._closed = True
        del self._array
        try:
            self._shm.unlink()
        except FileNotFoundError:
            pass
        self._shm.close()

    def __enter__(self) -> "HostBuffer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SharedSegments:
    """This process's attachments to host buffers by segment name, for addressing any
    `ShmRegion` on the host. Buffers this process owns are passed in and used directly."""

    def __init__(self, own: tuple[HostBuffer, ...] = (), prefault: bool = True) -> None:
        self._own = {b.name: b for b in own}
        self._attached: dict[str, tuple[mmap.mmap, np.ndarray]] = {}
        self._prefault = prefault
        self._lock = threading.Lock()

    def view(self, region: ShmRegion) -> np.ndarray:
        own = self._own.get(region.segment)
        if own is not None:
            return own.view(region)
        with self._lock:
            entry = self._attached.get(region.segment)
            if entry is None:
                entry = self._attach(region.segment)
                self._attached[region.segment] = entry
        return _slice(entry[1], region)

    def close(self) -> None:
        """Unmap every attached segment (never unlinks: the owners do)."""
        with self._lock:
            attached, self._attached = self._attached, {}
        while attached:
            _, (mapping, array) = attached.popitem()
            del array  # the last reference: the mapping can now be closed
            mapping.close()

    def __enter__(self) -> "SharedSegments":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _attach(self, name: str) -> tuple[mmap.mmap, np.ndarray]:
        # Not through SharedMemory: before Python 3.13 it registers attachments with the resource
        # tracker, whose cleanup would then unlink the owner's segment; only the owner may unlink.
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            mapping = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        if self._prefault:
            _prefault(mapping)
        return mapping, np.frombuffer(mapping, dtype=np.uint8)


def _slice(array: np.ndarray, region: ShmRegion) -> np.ndarray:
    end = region.offset_bytes + region.nbytes
    if region.offset_bytes < 0 or region.nbytes <= 0 or end > array.size:
        raise ValueError(f"region [{region.offset_bytes}, {end}) outside segment {region.segment} of {array.size} bytes")
    return array[region.offset_bytes:end]
