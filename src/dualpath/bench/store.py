"""Store read throughput against a plain direct read of the same disk (`dualpath bench store`).

Both measurements bypass the page cache: O_DIRECT where the file system supports it, otherwise
buffered reads after fdatasync + posix_fadvise(DONTNEED) on every file (the result says which).
The reference is one file of the same payload size read sequentially in `chunk_bytes` pieces by
one thread (what `dd iflag=direct bs=16M` does); the store reads one file per block, header
included, on its thread pool, and verifies every header and CRC32. Rates are payload bytes per
second (1 GB = 1e9 bytes). Acceptance target: store >= 0.8 x direct.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from dualpath.core.blocks import BlockLayout, chain_digests
from dualpath.runtime.store import files
from dualpath.runtime.store.store import BlockStore

TARGET_RATIO = 0.8  # project target: store reads at >= 80% of a direct read of the same disk (format costs <= 20%)
CHUNK_BYTES_DEFAULT = 16 << 20
_FINGERPRINT = "bench-" + "0" * 58
_GB = 1e9


def run_store_bench(
    directory: str | os.PathLike[str],
    total_bytes: int,
    layout: BlockLayout,
    num_threads: int,
    *,
    repeats: int = 2,
    chunk_bytes: int = CHUNK_BYTES_DEFAULT,
    seed: int = 0,
    keep_files: bool = False,
) -> dict:
    """Write a store of ceil(total_bytes / full_block_bytes) blocks and a same-size plain file
    under `directory`, then time both reads `repeats` times, interleaved, and keep each one's
    best. Files are deleted afterwards unless `keep_files`."""
    if total_bytes <= 0 or repeats < 1 or chunk_bytes % files.DIRECT_IO_ALIGN_BYTES:
        raise ValueError("need total_bytes > 0, repeats >= 1, chunk_bytes a multiple of 4096")
    os.makedirs(directory, exist_ok=True)
    work = tempfile.mkdtemp(prefix="dualpath-store-bench-", dir=directory)
    try:
        return _run(work, total_bytes, layout, num_threads, repeats, chunk_bytes, seed)
    finally:
        if not keep_files:
            shutil.rmtree(work, ignore_errors=True)


def _run(work: str, total_bytes: int, layout: BlockLayout, num_threads: int, repeats: int,
         chunk_bytes: int, seed: int) -> dict:
    block_bytes = layout.full_block_bytes
    num_blocks = math.ceil(total_bytes / block_bytes)
    payload_bytes = num_blocks * block_bytes
    digests = chain_digests(list(range(num_blocks * layout.block_tokens)), layout.block_tokens)
    out = memoryview(files.aligned_buffer(payload_bytes))
    np.frombuffer(out, dtype=np.uint8).fill(1)  # fault the pages in now, not in the first timing
    plain_path = os.path.join(work, "direct.bin")
    o_direct = _supports_o_direct(work)
    with BlockStore(os.path.join(work, "store"), layout, _FINGERPRINT, "uint8",
                    num_threads=num_threads, direct_io=o_direct) as store:
        write_s = _write_both(store, digests, plain_path, layout, seed)
        block_files = [files.block_path(store.root, d) for d in digests]
        _drop_cache([plain_path, *block_files])  # no write-back of either may overlap a timing
        direct_s: list[float] = []
        store_s: list[float] = []
        for _ in range(repeats):
            _drop_cache([plain_path])
            direct_s.append(_timed(lambda: _read_plain(plain_path, out, chunk_bytes, o_direct)))
            _drop_cache(block_files)
            store_s.append(_timed(lambda: _read_store(store, digests, out)))
        store_direct_blocks = store.stats().direct_read_blocks
    direct_gbps = payload_bytes / min(direct_s) / _GB
    store_gbps = payload_bytes / min(store_s) / _GB
    return {
        "num_blocks": num_blocks,
        "full_block_bytes": block_bytes,
        "payload_bytes": payload_bytes,
        "num_threads": num_threads,
        "cache_bypass": "O_DIRECT" if o_direct else "posix_fadvise(DONTNEED)",
        "store_used_o_direct": store_direct_blocks == repeats * num_blocks,
        "write_gbps": 2 * payload_bytes / write_s / _GB,
        "direct_read_gbps": direct_gbps,
        "store_read_gbps": store_gbps,
        "ratio": store_gbps / direct_gbps,
        "target_ratio": TARGET_RATIO,
        "meets_target": store_gbps >= TARGET_RATIO * direct_gbps,
        "direct_read_s": direct_s,
        "store_read_s": store_s,
        "checksum": "crc32",
        "checksum_gbps": checksum_gbps(out, num_threads=1),
        "checksum_parallel_gbps": checksum_gbps(out, num_threads=num_threads),
    }


def checksum_gbps(buf: memoryview, num_threads: int = 1, chunk_bytes: int = 4 << 20) -> float:
    """CRC32 throughput over `buf` (in memory), `num_threads` threads on disjoint chunks."""
    chunks = [buf[i : i + chunk_bytes] for i in range(0, len(buf), chunk_bytes)]
    with ThreadPoolExecutor(num_threads) as pool:
        start = time.perf_counter()
        list(pool.map(zlib.crc32, chunks))
        elapsed = time.perf_counter() - start
    return len(buf) / elapsed / _GB


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _write_both(store: BlockStore, digests: list[bytes], plain_path: str, layout: BlockLayout,
                seed: int) -> float:
    """Write every block to the store and the same bytes to the plain file; returns seconds."""
    block = np.random.default_rng(seed).integers(0, 256, layout.full_block_bytes, dtype=np.uint8)
    start = time.perf_counter()
    fd = os.open(plain_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i, digest in enumerate(digests):
            block[:8] = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)
            store.put(digest, block)
            files.write_all(fd, [memoryview(block)])
    finally:
        os.close(fd)
    return time.perf_counter() - start


def _read_plain(path: str, out: memoryview, chunk_bytes: int, o_direct: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if o_direct else 0))
    try:
        for offset in range(0, len(out), chunk_bytes):
            if files.preadv_all(fd, [out[offset : offset + chunk_bytes]], offset) == 0:
                raise IOError(f"{path}: short read at {offset}")
    finally:
        os.close(fd)


def _read_store(store: BlockStore, digests: list[bytes], out: memoryview) -> None:
    got = store.read_into(digests, out)
    if got != len(digests):
        raise RuntimeError(f"store returned {got} of {len(digests)} blocks")


def _drop_cache(paths: list[str]) -> None:
    """Flush and drop these files' pages so no measurement reads from the page cache."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _supports_o_direct(directory: str) -> bool:
    if not hasattr(os, "O_DIRECT"):
        return False
    probe = os.path.join(directory, "o_direct.probe")
    buf = files.aligned_buffer(files.DIRECT_IO_ALIGN_BYTES)
    try:
        with open(probe, "wb") as f:
            f.write(bytes(files.DIRECT_IO_ALIGN_BYTES))
        fd = os.open(probe, os.O_RDONLY | os.O_DIRECT)
        try:
            return os.preadv(fd, [buf], 0) == files.DIRECT_IO_ALIGN_BYTES
        finally:
            os.close(fd)
    except OSError:
        return False
    finally:
        files.unlink_quietly(probe)
