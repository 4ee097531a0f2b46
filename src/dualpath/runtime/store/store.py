"""Persistent KV block store: Full Blocks as files named by their chained digest. A block's path:

1. `put(d, payload)` claims d in this process (a second writer of d waits); an indexed d whose
   file exists is touched and reported ALREADY_PRESENT (gone: another process quarantined it).
2. The file for d is probed: a valid block of ours written by another process is adopted; a
   valid block of another model/layout/version is left alone (FOREIGN); a corrupt one is replaced.
3. Room is made: least recently used unpinned blocks are evicted (files deleted) and the bytes
   reserved, so concurrent writers never overshoot the capacity (NO_SPACE if pins prevent it).
4. Header + payload go to a temp file beside the final name (optional fsync), then `os.replace`
   makes the block visible atomically; the index lists it as most recently used.
5. `lookup(ds)` counts leading indexed digests; the first miss is re-checked on disk, which is
   how a block written by another process becomes visible without a `refresh()`.
6. `read_into(ds, out)` pins the prefix, reads every block (header and payload in one preadv,
   payload straight into `out`) on the thread pool, and verifies header and CRC32. The first
   invalid or unreadable block ends the returned prefix; it leaves the index and its file is
   quarantined.
7. Eviction, or a `refresh()` that finds its file gone, removes it from the index.

Faults are misses: a block failing a read (an OSError but ENOENT, a short file, a bad header or
CRC32) is never returned, and counted; a failed write (ENOSPC, EIO, ...) leaves no file, entry or
reservation behind, is counted and reported WRITE_FAILED. Digests are checked before a path is
built (`files.check_digest`). Tests inject faults through `_read_one` and `_write_payload`.
Capacity counts whole files (header + payload). One root holds one model's blocks: another
fingerprint's block at the same name is FOREIGN, neither used nor overwritten.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable, Sequence

from dualpath.core.blocks import BlockLayout
from dualpath.runtime.clock import Clock, MonotonicClock
from dualpath.runtime.store import files
from dualpath.runtime.store.buffers import address_of, block_payload, byte_view
from dualpath.runtime.store.errors import BlockFormatError, ForeignBlockError, OutputBufferError
from dualpath.runtime.store.format import DIGEST_BYTES, HEADER_BYTES, BlockHeader, make_header
from dualpath.runtime.store.index import IndexEntry, LruIndex
from dualpath.runtime.store.reads import ReadResult, failure_counter, header_buffer, read_chain
from dualpath.runtime.store.results import PutOutcome, PutReport, RefreshReport, StoreStats

STALE_TEMP_AGE_S_DEFAULT = 600.0  # a writer on another host silent this long is presumed dead
log = logging.getLogger(__name__)

_COUNTERS = ("hit_blocks", "miss_blocks", "written_blocks", "evicted_blocks", "checksum_failures",
             "header_failures", "quarantined_blocks", "direct_read_blocks", "read_errors", "write_failures")


class BlockStore:
    """Thread-safe store of Full Blocks under `root`; see the module docstring for the contract."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        layout: BlockLayout,
        fingerprint: str,
        dtype: str,
        capacity_bytes: int | None = None,
        num_threads: int = 4,
        clock: Clock = MonotonicClock(),
        *,
        fsync: bool = False,
        direct_io: bool = False,
        stale_temp_age_s: float = STALE_TEMP_AGE_S_DEFAULT,
    ) -> None:
        try:
            BlockHeader(fingerprint, dtype, layout, bytes(DIGEST_BYTES), 0)
        except BlockFormatError as exc:
            raise ValueError(str(exc)) from exc
        if num_threads < 1:
            raise ValueError(f"num_threads must be >= 1, got {num_threads}")
        self.root = os.fspath(root)
        self.layout, self.fingerprint, self.dtype = layout, fingerprint, dtype
        self.file_bytes = HEADER_BYTES + layout.full_block_bytes
        self._clock = clock
        self._fsync = fsync
        self._direct_io = direct_io and hasattr(os, "O_DIRECT")
        self._stale_temp_age_s = stale_temp_age_s
        self._num_threads = num_threads
        self._index = LruIndex(capacity_bytes)
        self._cv = threading.Condition()
        self._writing: set[bytes] = set()
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._made_dirs: set[str] = set()
        self._logged_errnos: set[int | None] = set()
        os.makedirs(self.root, exist_ok=True)
        self._pool = ThreadPoolExecutor(num_threads, thread_name_prefix="kvstore-io")
        self._verify_pool = ThreadPoolExecutor(min(num_threads, os.cpu_count() or 1),
                                               thread_name_prefix="kvstore-crc")
        self.refresh()

    # -- queries ---------------------------------------------------------------------------

    def lookup(self, digests: Sequence[bytes]) -> int:
        """Number of leading `digests` stored (a prefix chain). Does not count as an access."""
        n = 0
        for digest in [files.check_digest(d) for d in digests]:  # all checked before any I/O
            with self._cv:
                present = digest in self._index
            if not present and not self._adopt(digest):
                break
            n += 1
        return n

    def touch(self, digests: Sequence[bytes]) -> None:
        """Count the indexed blocks among `digests` as used now (a server that sends files itself)."""
        with self._cv:
            self._index.touch_chain([e for e in map(self._index.get, digests) if e is not None], self._clock.now_s())

    def lru_order(self) -> tuple[bytes, ...]:
        """Indexed digests, least recently used first (the eviction order, pins aside)."""
        with self._cv:
            return self._index.lru_order()

    def stats(self) -> StoreStats:
        with self._cv:
            return StoreStats(len(self._index), self._index.used_bytes, self._index.capacity_bytes,
                              **self._counts)

    @property
    def direct_io(self) -> bool:
        """Whether reads into aligned buffers use O_DIRECT (off after the first EINVAL)."""
        return self._direct_io

    # -- writes ----------------------------------------------------------------------------

    def put(self, digest: bytes, payload: Any) -> PutOutcome:
        """Store one Full Block (exactly `layout.full_block_bytes` bytes); idempotent."""
        digest = files.check_digest(digest)
        return self._put_one(digest, block_payload(digest, payload, self.layout))

    def put_many(self, items: Iterable[tuple[bytes, Any]]) -> PutReport:
        """Store several blocks in parallel; every payload is size-checked before any write.
        A chain larger than the free capacity keeps whichever of its blocks fit."""
        checked = [(d, block_payload(d, p, self.layout)) for d, p in ((files.check_digest(d), p) for d, p in items)]
        if len(checked) <= 1 or self._num_threads == 1:
            outcomes = [self._put_one(d, v) for d, v in checked]
        else:
            outcomes = list(self._pool.map(lambda dv: self._put_one(*dv), checked))
        with self._cv:
            present = [self._index.get(d) for d, _ in checked]
            self._index.touch_chain([e for e in present if e is not None], self._clock.now_s())
        return PutReport(tuple(d for d, _ in checked), tuple(outcomes))

    def _put_one(self, digest: bytes, view: memoryview) -> PutOutcome:
        with self._cv:
            while digest in self._writing:
                self._cv.wait()
            entry = self._index.get(digest)
            if entry is not None and os.path.exists(files.block_path(self.root, digest)):
                self._index.touch(entry, self._clock.now_s())
                return PutOutcome.ALREADY_PRESENT
            if entry is not None:  # a stale entry: rewrite the block, or it stays a miss for good
                self._index.remove_if(entry)
            self._writing.add(digest)
        try:
            return self._write_claimed(digest, view)
        except OSError as exc:  # ENOSPC, EIO, EFBIG, EROFS...: this block is not stored, the store goes on
            self._note_io_error("write_failures", exc, digest)
            return PutOutcome.WRITE_FAILED
        finally:
            with self._cv:
                self._writing.discard(digest)
                self._cv.notify_all()

    def _write_claimed(self, digest: bytes, view: memoryview) -> PutOutcome:
        path = files.block_path(self.root, digest)
        try:
            on_disk = self._matching_header(path, digest) is not None
        except ForeignBlockError:
            return PutOutcome.FOREIGN
        with self._cv:
            if on_disk:  # another process wrote it: adopt instead of rewriting
                return PutOutcome.ALREADY_PRESENT if self._admit_locked(digest) else PutOutcome.NO_SPACE
            victims = self._index.victims_for(self.file_bytes)
            if victims is None:
                return PutOutcome.NO_SPACE
            self._evict_locked(victims)
            self._index.reserved_bytes += self.file_bytes
        try:
            self._write_file(path, digest, view)
        except BaseException:
            with self._cv:
                self._index.reserved_bytes -= self.file_bytes
            raise
        with self._cv:  # reservation -> entry in one step, so no other writer sees the slack
            self._index.reserved_bytes -= self.file_bytes
            self._index.add(digest, self.file_bytes, self._clock.now_s())
            self._counts["written_blocks"] += 1
        return PutOutcome.WRITTEN

    def _write_file(self, path: str, digest: bytes, view: memoryview) -> None:
        header = make_header(self.fingerprint, self.dtype, self.layout, digest, view).encode()
        files.write_atomically(path, lambda fd: self._write_payload(fd, header, view), self._fsync, self._made_dirs)

    def _write_payload(self, fd: int, header: bytes, view: memoryview) -> None:
        """Write one block's bytes to its temp file (a seam for crash tests)."""
        files.write_all(fd, [memoryview(header), view])

    # -- reads -----------------------------------------------------------------------------

    def read_into(self, digests: Sequence[bytes], out: Any) -> int:
        """Read the stored prefix of `digests` into `out` (block i at byte i * full_block_bytes).

        `out` is any writable C-contiguous buffer (bytearray, memoryview, numpy array, CPU torch
        tensor, pinned or not). Returns the number of leading blocks that were present and passed
        their header and CRC32 checks; bytes of `out` past that prefix are unspecified."""
        digests = [files.check_digest(d) for d in digests]
        mv = byte_view(out, writable=True)
        block_bytes = self.layout.full_block_bytes
        if len(mv) < len(digests) * block_bytes:
            raise OutputBufferError(f"buffer has {len(mv)} bytes, {len(digests)} blocks need "
                                    f"{len(digests) * block_bytes}")
        entries = self._pin_prefix(digests)
        results: list[tuple[BaseException | None, bool]] = []
        try:
            results = self._read_blocks(entries, mv)
        finally:
            self._finish_read(entries, results, len(digests))
        return next((i for i, (err, _) in enumerate(results) if err is not None), len(results))

    def _pin_prefix(self, digests: list[bytes]) -> list[IndexEntry]:
        pinned: list[IndexEntry] = []
        for digest in digests:
            entry = self._pin(digest)
            if entry is None and self._adopt(digest):
                entry = self._pin(digest)
            if entry is None:
                break
            pinned.append(entry)
        return pinned

    def _pin(self, digest: bytes) -> IndexEntry | None:
        with self._cv:
            entry = self._index.get(digest)
            if entry is not None:
                entry.pins += 1
            return entry

    def _read_blocks(self, entries: list[IndexEntry], mv: memoryview) -> list[ReadResult]:
        block_bytes = self.layout.full_block_bytes
        direct = self._direct_io and files.is_aligned(address_of(mv), block_bytes)
        serial = len(entries) <= 1 or self._num_threads == 1
        return read_chain([e.digest for e in entries], mv, block_bytes, lambda d, dest: self._read_one(d, dest, direct),
                          None if serial else (self._pool, self._verify_pool))

    def _read_one(self, digest: bytes, dest: memoryview, direct: bool) -> tuple[BlockHeader, bool]:
        """Read one block into `dest` and check its header (not yet the payload CRC32);
        returns the header and whether O_DIRECT was used."""
        path = files.block_path(self.root, digest)
        try:
            header = files.read_block(path, header_buffer(), dest, direct)
        except OSError as exc:
            if not (direct and exc.errno == errno.EINVAL):
                raise
            self._direct_io = False  # the file system refuses O_DIRECT: stay buffered from now on
            return self._read_one(digest, dest, False)
        header.check_matches(self.fingerprint, self.dtype, self.layout, digest)
        return header, direct

    def _finish_read(self, entries: list[IndexEntry], results: list, num_asked: int) -> None:
        num_ok = next((i for i, (err, _) in enumerate(results) if err is not None), len(results))
        with self._cv:
            for entry, (err, direct) in zip(entries, results):
                if err is not None:
                    self._drop_failed_locked(entry, err)
                self._counts["direct_read_blocks"] += direct
            self._index.touch_chain(entries[:num_ok], self._clock.now_s())
            for entry in entries:
                entry.pins -= 1
            self._counts["hit_blocks"] += num_ok
            self._counts["miss_blocks"] += num_asked - num_ok

    def _drop_failed_locked(self, entry: IndexEntry, err: BaseException) -> None:
        """A block that failed a read leaves the index; a corrupt one is also quarantined. The
        identity check spares a fresh entry a concurrent re-put may have indexed meanwhile."""
        counter = failure_counter(err)
        if not self._index.remove_if(entry) or counter is None:
            return
        self._counts[counter] += 1
        if isinstance(err, OSError):
            self._log_once_locked(err, entry.digest)
        if files.quarantine(self.root, files.block_path(self.root, entry.digest)) is not None:
            self._counts["quarantined_blocks"] += 1

    def _note_io_error(self, counter: str, exc: OSError, digest: bytes) -> None:
        with self._cv:
            self._counts[counter] += 1
            self._log_once_locked(exc, digest)

    def _log_once_locked(self, exc: OSError, digest: bytes) -> None:
        """A warning for the first error of each errno (a full disk would otherwise log every put)."""
        if exc.errno not in self._logged_errnos:
            self._logged_errnos.add(exc.errno)
            log.warning("KV store %s: %s on block %s (counted in stats; later errors of this kind are not logged)",
                        self.root, exc, digest.hex())

    # -- index maintenance -----------------------------------------------------------------

    def _matching_header(self, path: str, digest: bytes) -> BlockHeader | None:
        """The header at `path` if it is a sound block of ours for `digest`; None if absent or
        corrupt. Raises ForeignBlockError for another model's / layout's / version's block."""
        try:
            header = files.read_header(path)
        except (FileNotFoundError, BlockFormatError):
            return None
        except OSError as exc:  # unreadable: not a block we can use (a put replaces it)
            self._note_io_error("read_errors", exc, digest)
            return None
        header.check_matches(self.fingerprint, self.dtype, self.layout, digest)
        return header

    def _adopt(self, digest: bytes) -> bool:
        """Miss re-check: index a block another process wrote, if there is room for it."""
        try:
            if self._matching_header(files.block_path(self.root, digest), digest) is None:
                return False
        except (ForeignBlockError, BlockFormatError):
            return False
        with self._cv:
            return digest not in self._writing and self._admit_locked(digest)

    def _admit_locked(self, digest: bytes) -> bool:
        if digest in self._index:
            return True
        victims = self._index.victims_for(self.file_bytes)
        if victims is None:
            return False
        self._evict_locked(victims)
        self._index.add(digest, self.file_bytes, self._clock.now_s())
        return True

    def _evict_locked(self, victims: list[IndexEntry]) -> None:
        # Unlinked under the lock, so a concurrent put of the same digest cannot lose its new file.
        for entry in victims:
            if self._index.remove_if(entry):
                files.unlink_quietly(files.block_path(self.root, entry.digest))
                self._counts["evicted_blocks"] += 1

    def refresh(self) -> RefreshReport:
        """Re-scan the directory: index blocks other processes wrote (oldest mtime first, evicting
        to stay within capacity), drop entries whose files are gone, remove dead writers' temps."""
        found, temps = files.scan(self.root)
        stale = files.stale_temps(self.root, temps, self._stale_temp_age_s)
        removed_temps = sum(files.unlink_quietly(t.path) for t in stale)
        with self._cv:
            known = set(self._index.lru_order())
        new = sorted((b for b in found if b.digest not in known), key=lambda b: (b.mtime_ns, b.digest))
        sound = list(self._pool.map(lambda b: self._check_found(b.path, b.digest), new))
        on_disk = {b.digest for b in found}
        added = dropped = 0
        with self._cv:
            for entry in self._index:
                path = files.block_path(self.root, entry.digest)
                if entry.digest not in on_disk and not os.path.exists(path):
                    dropped += self._index.remove_if(entry)
            for block, ok in zip(new, sound):
                if ok and block.digest not in self._writing and block.digest not in self._index:
                    added += self._admit_locked(block.digest)
        return RefreshReport(added, dropped, removed_temps)

    def _check_found(self, path: str, digest: bytes) -> bool:
        try:
            files.read_header(path).check_matches(self.fingerprint, self.dtype, self.layout, digest)
        except (FileNotFoundError, ForeignBlockError):
            return False
        except OSError as exc:
            self._note_io_error("read_errors", exc, digest)
            return False
        except BlockFormatError:
            with self._cv:
                self._counts["header_failures"] += 1
                self._counts["quarantined_blocks"] += files.quarantine(self.root, path) is not None
            return False
        return True

    # -- checks and lifetime ---------------------------------------------------------------
    def check_invariants(self) -> None:
        """Index conservation, capacity, LRU order, and index bytes == the listed files' sizes.
        Meant for a quiescent store (tests): other processes must not be evicting meanwhile."""
        with self._cv:
            self._index.check_invariants()
            entries = list(self._index)
            on_disk = sum(os.stat(files.block_path(self.root, e.digest)).st_size for e in entries)
            if on_disk != self._index.used_bytes:
                raise AssertionError(f"index lists {self._index.used_bytes} bytes, its files hold {on_disk}")

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._verify_pool.shutdown(wait=True)

    def __enter__(self) -> "BlockStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
