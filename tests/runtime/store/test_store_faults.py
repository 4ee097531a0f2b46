"""Storage faults are misses, never errors: a block that cannot be read is never returned (and is
counted); a write the file system refuses (ENOSPC, EIO, EFBIG) skips that block, leaves nothing
behind and leaves every stored block and the ledger intact; the store keeps serving."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys

import pytest
from store_helpers import DTYPE, FILE_BYTES, FINGERPRINT, LAYOUT, chain, files_under, open_store, path_of, payloads

from dualpath.runtime.store import BlockStore, PutOutcome, files

FB = LAYOUT.full_block_bytes


class FaultyStore(BlockStore):
    """Faults through the store's two I/O seams: reads of the digests in `read_faults` raise that
    OSError; while `write_fault` is set, a write puts half its bytes on disk, then raises it."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.read_faults: dict[bytes, int] = {}
        self.write_fault: int | None = None

    def _read_one(self, digest, dest, direct):
        if digest in self.read_faults:
            raise OSError(self.read_faults[digest], os.strerror(self.read_faults[digest]))
        return super()._read_one(digest, dest, direct)

    def _write_payload(self, fd, header, view):
        if self.write_fault is None:
            return super()._write_payload(fd, header, view)
        os.write(fd, header)
        os.write(fd, view[: len(view) // 2])
        raise OSError(self.write_fault, os.strerror(self.write_fault))


def faulty_store(root, **kwargs) -> FaultyStore:
    return FaultyStore(root, LAYOUT, FINGERPRINT, DTYPE, num_threads=2, **kwargs)


def temp_files(root) -> list[str]:
    return [p for p in files_under(root) if files.TEMP_MARK in p]


def test_a_read_error_is_a_counted_miss_and_the_rest_still_reads(tmp_path):
    digests, data = chain(6), payloads(6)
    with faulty_store(tmp_path) as store:
        store.put_many(zip(digests, data))
        store.read_faults[digests[3]] = errno.EIO
        out = bytearray(6 * FB)
        assert store.read_into(digests, out) == 3
        assert bytes(out[: 3 * FB]) == b"".join(data[:3])
        stats = store.stats()
        assert (stats.read_errors, stats.hit_blocks, stats.miss_blocks) == (1, 3, 3)
        assert (stats.checksum_failures, stats.header_failures, stats.quarantined_blocks) == (0, 0, 1)
        assert digests[3] not in store.lru_order() and store.lookup(digests) == 3
        store.check_invariants()
        tail = bytearray(2 * FB)
        assert store.read_into(digests[4:], tail) == 2 and bytes(tail) == data[4] + data[5]
        del store.read_faults[digests[3]]  # the disk recovers: a re-put restores the chain
        assert store.put(digests[3], data[3]) is PutOutcome.WRITTEN
        assert store.read_into(digests, out) == 6 and bytes(out) == b"".join(data)
        store.check_invariants()


def test_an_unreadable_block_file_is_a_miss_on_read_lookup_and_restart(tmp_path):
    """A real kernel error, no injection: a directory where a block file should be (EISDIR)."""
    digests, data = chain(3), payloads(3)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests, data))
        path = path_of(store, digests[1])
        os.unlink(path)
        os.mkdir(path)
        assert store.read_into(digests, bytearray(3 * FB)) == 1
        assert store.stats().read_errors == 1 and store.stats().num_blocks == 2
        store.check_invariants()
    os.rename(tmp_path / "quarantine", tmp_path / "moved-aside")
    os.mkdir(path)  # again, for a store that meets it at startup and on a lookup
    with open_store(tmp_path) as again:
        assert again.stats().read_errors == 1 and again.stats().num_blocks == 2
        assert again.lookup(digests) == 1
        assert again.stats().read_errors == 2  # the lookup's miss re-check met it too; nothing raised
        assert again.put(digests[1], data[1]) is PutOutcome.WRITE_FAILED  # a directory cannot be replaced
        again.check_invariants()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO])
def test_a_failed_write_is_skipped_and_leaves_the_store_intact(tmp_path, code):
    digests, data = chain(7), payloads(7)
    # room for exactly 7 blocks: a reservation leaked by a failed write would force an eviction later
    with faulty_store(tmp_path, capacity_bytes=7 * FILE_BYTES) as store:
        assert store.put_many(zip(digests[:4], data[:4])).written == tuple(digests[:4])
        before = files_under(tmp_path)
        store.write_fault = code
        report = store.put_many(zip(digests[4:], data[4:]))
        assert report.outcomes == (PutOutcome.WRITE_FAILED,) * 3
        assert store.put(digests[4], data[4]) is PutOutcome.WRITE_FAILED
        stats = store.stats()
        assert (stats.write_failures, stats.written_blocks, stats.num_blocks) == (4, 4, 4)
        assert stats.used_bytes == 4 * FILE_BYTES
        assert files_under(tmp_path) == before and temp_files(tmp_path) == []  # no torn file, no temp
        assert store.lookup(digests) == 4
        store.check_invariants()
        out = bytearray(4 * FB)
        assert store.read_into(digests[:4], out) == 4 and bytes(out) == b"".join(data[:4])
        store.write_fault = None  # space again: the same puts now succeed, without evicting anything
        assert store.put_many(zip(digests[4:], data[4:])).written == tuple(digests[4:])
        assert store.stats().evicted_blocks == 0 and store.lookup(digests) == 7
        store.check_invariants()


CHILD = """
import json, resource, signal, sys
sys.path.insert(0, sys.argv[2])
from store_helpers import DTYPE, FILE_BYTES, FINGERPRINT, LAYOUT, chain, payloads
from dualpath.runtime.store import BlockStore
store = BlockStore(sys.argv[1], LAYOUT, FINGERPRINT, DTYPE, num_threads=1)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_BYTES // 2, resource.RLIM_INFINITY))
outcome = store.put(chain(3)[2], payloads(3)[2])
out = bytearray(2 * LAYOUT.full_block_bytes)
print(json.dumps({"outcome": outcome.value, "read": store.read_into(chain(3)[:2], out),
                  "intact": bytes(out) == b"".join(payloads(3)[:2]), "write_failures": store.stats().write_failures}))
"""


def test_a_write_error_from_the_kernel_is_skipped(tmp_path):
    """No injection: a file-size limit (RLIMIT_FSIZE) makes the kernel fail the write with EFBIG."""
    digests, data = chain(3), payloads(3)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests[:2], data[:2]))
    here = os.path.dirname(__file__)
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), here], capture_output=True, text=True,
                           timeout=60, cwd=here)
    assert child.returncode == 0, child.stderr
    assert json.loads(child.stdout) == {"outcome": "write_failed", "read": 2, "intact": True, "write_failures": 1}
    assert temp_files(tmp_path) == []
    with open_store(tmp_path) as store:
        assert store.lookup(digests) == 2 and store.stats().num_blocks == 2
        store.check_invariants()


def test_random_faults_never_return_wrong_bytes_and_keep_the_ledger(tmp_path):
    """Seeded random puts and reads, with read errors and full-disk writes switched on and off:
    every returned prefix holds the right bytes, and the ledger checks after every step."""
    rng = random.Random(11)
    digests, data = chain(12), payloads(12)
    truth = dict(zip(digests, data))
    with faulty_store(tmp_path, capacity_bytes=8 * FILE_BYTES) as store:
        for _ in range(150):
            store.write_fault = errno.ENOSPC if rng.random() < 0.3 else None
            store.read_faults = {d: errno.EIO for d in rng.sample(digests, 2)} if rng.random() < 0.3 else {}
            start = rng.randrange(12)
            chunk = digests[start : start + rng.randint(1, 4)]
            if rng.random() < 0.5:
                report = store.put_many((d, truth[d]) for d in chunk)
                if store.write_fault is not None:
                    assert PutOutcome.WRITTEN not in report.outcomes
            else:
                out = bytearray(len(chunk) * FB)
                got = store.read_into(chunk, out)
                assert bytes(out[: got * FB]) == b"".join(truth[d] for d in chunk[:got])
                assert not set(chunk[:got]) & set(store.read_faults)
            store.check_invariants()
        stats = store.stats()
        assert stats.write_failures > 0 and stats.read_errors > 0 and stats.hit_blocks > 0
        assert temp_files(tmp_path) == []
