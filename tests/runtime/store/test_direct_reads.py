"""The engines' store reads (RuntimeConfig.store.direct_io, on by default) bypass the page cache:
a block read into a slot of a host buffer, as an engine's reader does, goes through O_DIRECT on a
file system that allows it, with the same bytes as a buffered read."""

import pytest

from dualpath.config import RuntimeConfig
from dualpath.runtime.store.remote import store_for
from dualpath.runtime.transport.shm import HostBuffer
from store_helpers import DTYPE, FINGERPRINT, LAYOUT, chain, payloads


def test_a_read_into_a_host_buffer_slot_uses_o_direct(tmp_path):
    assert RuntimeConfig(model="tiny").store.direct_io  # what engines open their stores with
    digests, data = chain(3), payloads(3)
    store = store_for(str(tmp_path), LAYOUT, FINGERPRINT, DTYPE, num_threads=1, direct_io=True)
    for d, p in zip(digests, data):
        store.put(d, p)
    fbb = LAYOUT.full_block_bytes
    with HostBuffer.create(fbb, 4) as buf:
        buf.allocate(fbb)
        slot = buf.view(buf.allocate(fbb))  # the second slot: an engine's reads land at any slot
        for d, p in zip(digests, data):
            assert store.read_into([d], slot) == 1 and bytes(slot) == p
        del slot  # the segment closes only without views into it
    if not store.direct_io:
        pytest.skip("this file system refuses O_DIRECT (the store fell back to buffered reads)")
    assert store.stats().direct_read_blocks == 3
