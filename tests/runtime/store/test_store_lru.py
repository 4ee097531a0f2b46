"""Capacity and LRU eviction: exact order on small cases, a model check on random sequences."""

import os
import tempfile
import threading
from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st
from store_helpers import FILE_BYTES, LAYOUT, chain, files_under, open_store, path_of, payloads

from dualpath.runtime.clock import ManualClock
from dualpath.runtime.store import BlockStore, PutOutcome

FB = LAYOUT.full_block_bytes


def test_least_recently_used_is_evicted_and_its_file_deleted(tmp_path):
    a, b, c, d = chain(4)
    data = payloads(4)
    clock = ManualClock()
    with open_store(tmp_path, capacity_bytes=3 * FILE_BYTES, clock=clock) as store:
        for digest, payload in zip((a, b, c), data):
            assert store.put(digest, payload) is PutOutcome.WRITTEN
            clock.advance(1)
        assert store.read_into([a], bytearray(FB)) == 1  # a becomes most recent
        clock.advance(1)
        assert store.put(d, data[3]) is PutOutcome.WRITTEN
        assert store.lru_order() == (c, a, d)
        assert not os.path.exists(path_of(store, b))
        assert store.stats().evicted_blocks == 1 and store.stats().used_bytes == 3 * FILE_BYTES
        assert store.lookup([b]) == 0
        store.check_invariants()


def test_chain_tail_goes_before_its_head(tmp_path):
    xs, data = chain(3), payloads(3)
    y = chain(1, seed=5)[0]
    with open_store(tmp_path, capacity_bytes=3 * FILE_BYTES) as store:
        store.put_many(zip(xs, data))
        assert store.lru_order() == (xs[2], xs[1], xs[0])
        store.put(y, data[0])
        assert store.lookup(xs) == 2  # the tail block went, the head survives
        assert store.read_into(xs, bytearray(3 * FB)) == 2
        assert store.lru_order() == (y, xs[1], xs[0])


def test_no_space_when_a_block_cannot_fit(tmp_path):
    with open_store(tmp_path, capacity_bytes=FILE_BYTES - 1) as store:
        assert store.put(chain(1)[0], payloads(1)[0]) is PutOutcome.NO_SPACE
        assert store.stats().num_blocks == 0 and files_under(tmp_path) == []


class GatedStore(BlockStore):
    """Holds reads of one digest until released, so a read can be kept in flight."""

    def gate(self, digest: bytes) -> None:
        self.gate_digest, self.entered, self.release = digest, threading.Event(), threading.Event()

    def _read_one(self, digest, dest, direct):
        if digest == self.gate_digest:
            self.entered.set()
            assert self.release.wait(10)
        return super()._read_one(digest, dest, direct)


def gated_store(root, capacity_blocks: int, gate: bytes) -> GatedStore:
    store = GatedStore(root, LAYOUT, "ab" * 32, "bfloat16", capacity_bytes=capacity_blocks * FILE_BYTES,
                       num_threads=2)
    store.gate(gate)
    return store


def test_blocks_being_read_are_never_evicted(tmp_path):
    a, b, c, d = chain(4)
    data = payloads(4)
    store = gated_store(tmp_path, 2, gate=a)
    store.put(a, data[0])
    store.put(b, data[1])
    out, results = bytearray(FB), []
    reader = threading.Thread(target=lambda: results.append(store.read_into([a], out)))
    reader.start()
    assert store.entered.wait(10)
    assert store.put(c, data[2]) is PutOutcome.WRITTEN  # a is least recent but pinned: b goes
    assert store.lru_order() == (a, c)
    assert store.put(d, data[3]) is PutOutcome.WRITTEN  # c goes, still not a
    assert store.lru_order() == (a, d)
    store.release.set()
    reader.join(10)
    assert results == [1] and bytes(out) == data[0]
    assert store.lru_order() == (d, a)
    store.check_invariants()
    store.close()


def test_store_full_of_pinned_blocks_says_no_space(tmp_path):
    a, b = chain(2)
    data = payloads(2)
    store = gated_store(tmp_path, 1, gate=a)
    store.put(a, data[0])
    reader = threading.Thread(target=store.read_into, args=([a], bytearray(FB)))
    reader.start()
    assert store.entered.wait(10)
    assert store.put(b, data[1]) is PutOutcome.NO_SPACE
    store.release.set()
    reader.join(10)
    assert store.put(b, data[1]) is PutOutcome.WRITTEN and store.lru_order() == (b,)
    store.close()


def test_restart_over_capacity_evicts_oldest_files_first(tmp_path):
    digests, data = chain(4), payloads(4)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests, data))
        for age, digest in zip((40, 30, 20, 10), digests):  # digests[0] is the oldest file
            st_ = os.stat(path_of(store, digest))
            os.utime(path_of(store, digest), ns=(st_.st_atime_ns, st_.st_mtime_ns - age * 10**9))
    with open_store(tmp_path, capacity_bytes=2 * FILE_BYTES) as small:
        assert small.lru_order() == (digests[2], digests[3])
        assert len(files_under(tmp_path)) == 2
        small.check_invariants()


NUM_DIGESTS = 8
op = st.one_of(
    st.tuples(st.just("put"), st.integers(0, NUM_DIGESTS - 1)),
    st.tuples(st.just("read"), st.integers(0, NUM_DIGESTS - 1), st.integers(1, 4)),
    st.tuples(st.just("lookup"), st.integers(0, NUM_DIGESTS - 1), st.integers(1, 4)),
)


@settings(max_examples=40, deadline=None)
@given(cap_blocks=st.integers(1, 5), slack=st.integers(0, FILE_BYTES - 1), ops=st.lists(op, max_size=25),
       steps=st.lists(st.floats(0, 2), min_size=25, max_size=25))
def test_random_sequences_match_an_lru_model(cap_blocks, slack, ops, steps):
    digests, data = chain(NUM_DIGESTS, seed=3), payloads(NUM_DIGESTS, seed=3)
    model: OrderedDict[int, None] = OrderedDict()
    clock = ManualClock()
    with tempfile.TemporaryDirectory() as root, \
            open_store(root, capacity_bytes=cap_blocks * FILE_BYTES + slack, clock=clock) as store:
        for step, (kind, i, *rest) in zip(steps, ops):
            clock.advance(step)
            span = list(range(i, min(i + (rest[0] if rest else 1), NUM_DIGESTS)))
            present = next((k for k, j in enumerate(span) if j not in model), len(span))
            if kind == "put":
                expected = PutOutcome.ALREADY_PRESENT if i in model else PutOutcome.WRITTEN
                if i not in model and len(model) == cap_blocks:
                    model.popitem(last=False)
                model[i] = None
                model.move_to_end(i)
                assert store.put(digests[i], data[i]) is expected
            elif kind == "read":
                out = bytearray(len(span) * FB)
                assert store.read_into([digests[j] for j in span], out) == present
                assert bytes(out[: present * FB]) == b"".join(data[j] for j in span[:present])
                for j in reversed(span[:present]):
                    model.move_to_end(j)
            else:
                assert store.lookup([digests[j] for j in span]) == present
            assert store.lru_order() == tuple(digests[j] for j in model)
            assert len(files_under(root)) == len(model) <= cap_blocks
            store.check_invariants()
