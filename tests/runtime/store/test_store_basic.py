"""BlockStore round trips, prefix lookups, restart, foreign blocks, buffer kinds."""

import os

import numpy as np
import pytest
import torch
from store_helpers import DTYPE, FILE_BYTES, FINGERPRINT, LAYOUT, chain, files_under, open_store, path_of, payloads

from dualpath.core.blocks import BlockLayout
from dualpath.runtime.store import BlockStore, OutputBufferError, PayloadSizeError, PutOutcome
from dualpath.runtime.store.format import HEADER_BYTES, parse_header

FB = LAYOUT.full_block_bytes


def test_put_lookup_read_round_trip(tmp_path):
    digests, data = chain(6), payloads(6)
    with open_store(tmp_path) as store:
        report = store.put_many(zip(digests, data))
        assert report.written == tuple(digests)
        assert store.lookup(digests) == 6
        out = bytearray(6 * FB)
        assert store.read_into(digests, out) == 6
        assert bytes(out) == b"".join(data)
        stats = store.stats()
        assert (stats.num_blocks, stats.used_bytes, stats.hit_blocks, stats.miss_blocks) == (6, 6 * FILE_BYTES, 6, 0)
        store.check_invariants()


def test_file_layout_and_header(tmp_path):
    digest, data = chain(1)[0], payloads(1)[0]
    with open_store(tmp_path) as store:
        assert store.put(digest, data) is PutOutcome.WRITTEN
        path = path_of(store, digest)
    assert path == os.path.join(tmp_path, digest.hex()[:2], digest.hex() + ".kvb")
    raw = open(path, "rb").read()
    assert len(raw) == FILE_BYTES and raw[HEADER_BYTES:] == data
    header = parse_header(raw[:HEADER_BYTES])
    assert (header.fingerprint, header.dtype, header.layout, header.digest) == (FINGERPRINT, DTYPE, LAYOUT, digest)


def test_lookup_and_read_stop_at_the_first_missing_block(tmp_path):
    digests, data = chain(5), payloads(5)
    with open_store(tmp_path) as store:
        store.put_many([(d, p) for i, (d, p) in enumerate(zip(digests, data)) if i != 2])
        assert store.lookup(digests) == 2
        assert store.lookup(digests[3:]) == 2
        out = np.zeros(5 * FB, dtype=np.uint8)
        assert store.read_into(digests, out) == 2
        assert out[: 2 * FB].tobytes() == data[0] + data[1]
        assert store.stats().miss_blocks == 3
        assert store.lookup([]) == 0 and store.read_into([], bytearray()) == 0


def test_put_is_idempotent_and_checks_size(tmp_path):
    digest, data = chain(1)[0], payloads(1)[0]
    with open_store(tmp_path) as store:
        assert store.put(digest, data) is PutOutcome.WRITTEN
        mtime = os.stat(path_of(store, digest)).st_mtime_ns
        assert store.put(digest, data) is PutOutcome.ALREADY_PRESENT
        assert os.stat(path_of(store, digest)).st_mtime_ns == mtime
        with pytest.raises(PayloadSizeError):
            store.put(chain(2)[1], data[:-1])
        with pytest.raises(PayloadSizeError):
            store.put_many([(chain(3)[2], data), (chain(2)[1], data + b"x")])
        assert store.lookup(chain(3)) == 1  # nothing of the refused batch was written
        assert store.stats().written_blocks == 1


def test_bad_output_buffers_are_refused(tmp_path):
    digests = chain(2)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests, payloads(2)))
        with pytest.raises(OutputBufferError):
            store.read_into(digests, bytearray(2 * FB - 1))
        with pytest.raises(OutputBufferError):
            store.read_into(digests, bytes(2 * FB))
        with pytest.raises(OutputBufferError):
            store.read_into(digests, np.zeros((2 * FB, 2), dtype=np.uint8)[:, 0])
        assert store.stats().hit_blocks == 0


def test_read_into_torch_tensor(tmp_path):
    digests, data = chain(3), payloads(3)
    pin = torch.cuda.is_available()
    out = torch.zeros((3, FB), dtype=torch.uint8, pin_memory=pin)
    with open_store(tmp_path) as store:
        store.put(digests[0], torch.frombuffer(bytearray(data[0]), dtype=torch.uint8))
        store.put_many(zip(digests[1:], data[1:]))
        assert store.read_into(digests, out) == 3
    assert bytes(out.numpy().tobytes()) == b"".join(data)
    with open_store(tmp_path) as store, pytest.raises(OutputBufferError):
        store.read_into(digests, torch.zeros((FB, 3), dtype=torch.uint8).t())


def test_restart_rebuilds_the_index(tmp_path):
    digests, data = chain(8), payloads(8)
    with open_store(tmp_path) as store:
        store.put_many(zip(digests[:5], data[:5]))
        before = [store.lookup(digests[i:]) for i in range(8)]
        used = store.stats().used_bytes
    with open_store(tmp_path) as again:
        assert [again.lookup(digests[i:]) for i in range(8)] == before == [5, 4, 3, 2, 1, 0, 0, 0]
        assert again.stats().used_bytes == used
        out = bytearray(8 * FB)
        assert again.read_into(digests, out) == 5 and bytes(out[: 5 * FB]) == b"".join(data[:5])
        again.check_invariants()


@pytest.mark.parametrize(
    "other",
    [
        dict(fingerprint="cd" * 32),
        dict(dtype="float16"),
        dict(layout=BlockLayout(1, 4, 1024)),  # same Full Block bytes, other layout
    ],
)
def test_blocks_of_another_model_are_ignored_not_deleted(tmp_path, other):
    digests, data = chain(3), payloads(3)
    with open_store(tmp_path, **other) as theirs:
        theirs.put_many(zip(digests, data))
    listing = files_under(tmp_path)
    with open_store(tmp_path) as ours:
        assert ours.stats().num_blocks == 0
        assert ours.lookup(digests) == 0
        assert ours.read_into(digests, bytearray(3 * FB)) == 0
        assert ours.put(digests[0], payloads(1, seed=9)[0]) is PutOutcome.FOREIGN
        assert ours.stats().quarantined_blocks == 0
    assert files_under(tmp_path) == listing
    with open_store(tmp_path, **other) as theirs:
        assert theirs.lookup(digests) == 3


def test_constructor_validates(tmp_path):
    with pytest.raises(ValueError):
        BlockStore(tmp_path, LAYOUT, "", DTYPE)
    with pytest.raises(ValueError):
        BlockStore(tmp_path, LAYOUT, FINGERPRINT, DTYPE, num_threads=0)
    with pytest.raises(ValueError):
        BlockStore(tmp_path, LAYOUT, FINGERPRINT, DTYPE, capacity_bytes=-1)
