"""Concurrent readers and writers in one process; several stores (processes) on one directory."""

import os
import random
import threading

from store_helpers import FILE_BYTES, LAYOUT, chain, files_under, open_store, path_of, payloads

from dualpath.runtime.store import PutOutcome

FB = LAYOUT.full_block_bytes


def test_threads_reading_and_writing_see_only_whole_correct_blocks(tmp_path):
    chains = [chain(12, seed=s) for s in range(3)]
    datas = [payloads(12, seed=s) for s in range(3)]
    errors: list[BaseException] = []
    hits: list[int] = []
    store = open_store(tmp_path, capacity_bytes=20 * FILE_BYTES, num_threads=4)
    writers_done = threading.Barrier(3 + 1)  # three writers and the main thread
    writing = threading.Event()
    writing.set()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(15):
            c = rng.randrange(3)
            lo = rng.randrange(12)
            hi = rng.randrange(lo, 12) + 1
            report = store.put_many(zip(chains[c][lo:hi], datas[c][lo:hi]))
            assert set(report.outcomes) <= {PutOutcome.WRITTEN, PutOutcome.ALREADY_PRESENT, PutOutcome.NO_SPACE}

    def reader(seed: int) -> None:
        # A miss returns at once while a write touches files, so a fixed number of reads could all
        # land before the first write: read for as long as any writer runs (and at least 30 times).
        rng = random.Random(seed)
        reads = 0
        while reads < 30 or writing.is_set():
            reads += 1
            c = rng.randrange(3)
            lo = rng.randrange(12)
            out = bytearray((12 - lo) * FB)
            n = store.read_into(chains[c][lo:], out)
            assert bytes(out[: n * FB]) == b"".join(datas[c][lo : lo + n])
            hits.append(n)

    def guarded(fn, seed):
        try:
            fn(seed)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)
        finally:
            if fn is writer:
                writers_done.wait(60)

    threads = [threading.Thread(target=guarded, args=(fn, s)) for s in range(3) for fn in (writer, reader)]
    for t in threads:
        t.start()
    writers_done.wait(60)
    writing.clear()
    for t in threads:
        t.join(60)
    assert errors == []
    assert sum(hits) > 0  # the readers did find blocks while writers were evicting
    stats = store.stats()
    assert stats.checksum_failures == stats.header_failures == 0
    assert stats.used_bytes <= 20 * FILE_BYTES and len(files_under(tmp_path)) == stats.num_blocks
    assert stats.hit_blocks == sum(hits)
    store.check_invariants()
    store.close()


def test_same_digest_written_by_many_threads_at_once_is_written_once(tmp_path):
    digest, data = chain(1)[0], payloads(1)[0]
    outcomes = []
    with open_store(tmp_path, num_threads=4) as store:
        threads = [threading.Thread(target=lambda: outcomes.append(store.put(digest, data))) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        assert sorted(o.value for o in outcomes) == ["already_present"] * 7 + ["written"]
        assert store.stats().written_blocks == 1
        store.check_invariants()


def test_a_block_written_by_another_store_becomes_visible(tmp_path):
    digests, data = chain(6), payloads(6)
    with open_store(tmp_path) as a, open_store(tmp_path) as b:
        a.put_many(zip(digests[:3], data[:3]))
        assert b.stats().num_blocks == 0
        assert b.lookup(digests) == 3  # miss-triggered re-check of the files
        out = bytearray(6 * FB)
        assert b.read_into(digests, out) == 3 and bytes(out[: 3 * FB]) == b"".join(data[:3])
        a.put_many(zip(digests[3:], data[3:]))
        report = b.refresh()
        assert report.added_blocks == 3 and b.stats().num_blocks == 6
        assert b.put(digests[4], data[4]) is PutOutcome.ALREADY_PRESENT
        assert a.stats().written_blocks == 6 and b.stats().written_blocks == 0


def test_eviction_by_another_store_is_a_plain_miss(tmp_path):
    digests, data = chain(4), payloads(4)
    extra, extra_data = chain(2, seed=7), payloads(2, seed=7)
    with open_store(tmp_path) as big, open_store(tmp_path, capacity_bytes=4 * FILE_BYTES) as small:
        big.put_many(zip(digests, data))
        assert small.refresh().added_blocks == 4
        small.put_many(zip(extra, extra_data))  # evicts two of the chain's files
        assert small.stats().evicted_blocks == 2
        alive = [os.path.exists(path_of(big, d)) for d in digests]
        assert sum(alive) == 2
        assert big.read_into(digests, bytearray(4 * FB)) == alive.index(False)
        stats = big.stats()
        assert (stats.checksum_failures, stats.header_failures, stats.quarantined_blocks) == (0, 0, 0)
        assert big.stats().num_blocks == 2  # every vanished block the read met left the index
        report = big.refresh()
        assert (report.added_blocks, report.dropped_blocks) == (2, 0)
        assert big.lookup(extra) == 2


def test_refresh_drops_entries_whose_files_are_gone(tmp_path):
    digests, data = chain(3), payloads(3)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests, data))
        os.unlink(path_of(store, digests[1]))
        report = store.refresh()
        assert (report.added_blocks, report.dropped_blocks) == (0, 1)
        assert store.lru_order() == (digests[2], digests[0])
        store.check_invariants()
