"""A damaged block is never used: the read stops before it, it leaves the index, its file is
quarantined, nothing else changes, and a re-put of the right bytes restores it."""

import os

import pytest
from store_helpers import FILE_BYTES, LAYOUT, chain, files_under, flip_byte, open_store, path_of, payloads

from dualpath.runtime.store import PutOutcome
from dualpath.runtime.store.format import HEADER_BYTES

FB = LAYOUT.full_block_bytes
BAD = 3  # index of the damaged block in a chain of 6


def damage_and_read(tmp_path, offset: int):
    digests, data = chain(6), payloads(6)
    store = open_store(tmp_path)
    store.put_many(zip(digests, data))
    flip_byte(path_of(store, digests[BAD]), offset)
    out = bytearray(6 * FB)
    got = store.read_into(digests, out)
    return store, digests, data, out, got


@pytest.mark.parametrize(
    "offset, counter",
    [
        (HEADER_BYTES + 1234, "checksum_failures"),  # payload byte
        (HEADER_BYTES + FB - 1, "checksum_failures"),  # last payload byte
        (44, "header_failures"),  # inside the header's digest field
        (1000, "header_failures"),  # header padding
    ],
)
def test_flipped_byte_is_a_miss_quarantined_and_repairable(tmp_path, offset, counter):
    store, digests, data, out, got = damage_and_read(tmp_path, offset)
    with store:
        assert got == BAD
        assert bytes(out[: BAD * FB]) == b"".join(data[:BAD])
        stats = store.stats()
        assert getattr(stats, counter) == 1 and stats.quarantined_blocks == 1
        assert stats.checksum_failures + stats.header_failures == 1
        assert stats.num_blocks == 5 and stats.used_bytes == 5 * FILE_BYTES
        assert digests[BAD] not in store.lru_order()
        assert not os.path.exists(path_of(store, digests[BAD]))
        assert [p for p in files_under(tmp_path) if p.startswith("quarantine")] != []
        store.check_invariants()
        # nothing else is affected: the blocks after the bad one still read
        tail = bytearray(2 * FB)
        assert store.read_into(digests[BAD + 1 :], tail) == 2
        assert bytes(tail) == data[BAD + 1] + data[BAD + 2]
        assert store.lookup(digests) == BAD
        # a re-put of the correct bytes works again
        assert store.put(digests[BAD], data[BAD]) is PutOutcome.WRITTEN
        assert store.lookup(digests) == 6
        full = bytearray(6 * FB)
        assert store.read_into(digests, full) == 6 and bytes(full) == b"".join(data)
        store.check_invariants()


def test_truncated_block_is_a_miss(tmp_path):
    digests, data = chain(3), payloads(3)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests, data))
        os.truncate(path_of(store, digests[1]), FILE_BYTES - 100)
        assert store.read_into(digests, bytearray(3 * FB)) == 1
        assert store.stats().header_failures == 1 and store.stats().num_blocks == 2


def test_corrupt_block_found_at_startup_is_quarantined_not_indexed(tmp_path):
    digests, data = chain(3), payloads(3)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests, data))
        flip_byte(path_of(store, digests[0]), 20)  # header: detected by the startup scan
        flip_byte(path_of(store, digests[1]), HEADER_BYTES + 5)  # payload: only a read sees it
    with open_store(tmp_path) as again:
        stats = again.stats()
        assert (stats.num_blocks, stats.header_failures, stats.quarantined_blocks) == (2, 1, 1)
        assert again.lookup(digests) == 0
        assert again.read_into(digests[1:], bytearray(2 * FB)) == 0
        assert again.stats().checksum_failures == 1 and again.stats().num_blocks == 1


def test_block_deleted_behind_the_stores_back_is_a_plain_miss(tmp_path):
    digests, data = chain(3), payloads(3)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests, data))
        os.unlink(path_of(store, digests[2]))
        assert store.read_into(digests, bytearray(3 * FB)) == 2
        stats = store.stats()
        assert (stats.num_blocks, stats.checksum_failures, stats.quarantined_blocks) == (2, 0, 0)
        store.check_invariants()


def test_a_block_another_process_quarantined_is_written_again_not_reported_present(tmp_path):
    """Two processes' stores on one root (a PE reads, a DE persists): the reader quarantines a corrupt
    block; the writer's index still lists it, yet its next put of that block rewrites the file."""
    digests, data = chain(1), payloads(1)
    writer, reader = open_store(tmp_path), open_store(tmp_path)
    assert writer.put(digests[0], data[0]) is PutOutcome.WRITTEN
    flip_byte(path_of(writer, digests[0]), 4096 + 7)
    assert reader.read_into(digests, bytearray(LAYOUT.full_block_bytes)) == 0  # quarantined
    assert writer.put(digests[0], data[0]) is PutOutcome.WRITTEN
    out = bytearray(LAYOUT.full_block_bytes)
    assert reader.read_into(digests, out) == 1 and bytes(out) == data[0]
    writer.check_invariants()
    writer.close(), reader.close()
