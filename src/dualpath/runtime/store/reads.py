"""Reading a chain of blocks into one caller's buffer on the store's thread pools.

Reads run on the I/O pool; each read hands its CRC32 to the verify pool, so `num_threads` reads
stay in flight while checksums run (CRC32 is the CPU cost of a read; it would otherwise stall the
queue). Every read has returned before `read_chain` does, whatever failed: no thread may still be
writing into the caller's buffer afterwards.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, Callable, Sequence

from dualpath.runtime.store.errors import BlockFormatError, ForeignBlockError, PayloadChecksumError
from dualpath.runtime.store.files import aligned_buffer
from dualpath.runtime.store.format import HEADER_BYTES, BlockHeader, verify_quietly

ReadOne = Callable[[bytes, memoryview], tuple[BlockHeader, bool]]  # (digest, dest) -> (header, used O_DIRECT)
ReadResult = tuple[BaseException | None, bool]  # (why the block is unusable, or None; read with O_DIRECT)
_local = threading.local()


def header_buffer() -> memoryview:
    """This thread's page-aligned buffer for one block header (an O_DIRECT read needs alignment)."""
    buf = getattr(_local, "header", None)
    if buf is None:
        buf = _local.header = memoryview(aligned_buffer(HEADER_BYTES))
    return buf


def read_chain(digests: Sequence[bytes], mv: memoryview, block_bytes: int, read_one: ReadOne,
               pools: tuple[ThreadPoolExecutor, ThreadPoolExecutor] | None) -> list[ReadResult]:
    """Block i of `digests` into mv[i * block_bytes, (i + 1) * block_bytes), header checked by
    `read_one` and payload CRC32 here; serially in this thread when `pools` is None, else on
    (I/O pool, verify pool). A read's OSError or format error is its result, never raised."""

    def read(i: int, verify_pool: ThreadPoolExecutor | None) -> tuple[Any, bool]:
        dest = mv[i * block_bytes : (i + 1) * block_bytes]
        try:
            header, used_direct = read_one(digests[i], dest)
        except (OSError, BlockFormatError, ForeignBlockError) as exc:
            return exc, False
        if verify_pool is None:
            return verify_quietly(header, dest), used_direct
        return verify_pool.submit(verify_quietly, header, dest), used_direct

    if pools is None:
        return [read(i, None) for i in range(len(digests))]
    io_pool, verify_pool = pools
    reads = [io_pool.submit(read, i, verify_pool) for i in range(len(digests))]
    wait(reads)
    raw = [f.result() for f in reads]
    wait([res for res, _ in raw if isinstance(res, Future)])
    return [(res.result() if isinstance(res, Future) else res, d) for res, d in raw]


def failure_counter(err: BaseException) -> str | None:
    """The StoreStats counter a failed read counts in (its block is then quarantined), or None: a
    file deleted behind the store's back is a plain miss, another model's block not ours to move."""
    if isinstance(err, PayloadChecksumError):
        return "checksum_failures"
    if isinstance(err, BlockFormatError):
        return "header_failures"
    if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
        return "read_errors"
    return None
