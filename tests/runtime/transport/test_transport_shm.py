"""HostBuffer slots: conservation under random alloc/free, addressing from other mappings, cleanup."""

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.runtime.transport.shm import BufferFull, HostBuffer, SharedSegments, ShmRegion


def _exists(name):
    return os.path.exists(f"/dev/shm/{name}")


@settings(max_examples=40, deadline=None)
@given(ops=st.lists(st.tuples(st.booleans(), st.integers(0, 100)), max_size=60), num_slots=st.integers(1, 8))
def test_random_alloc_free_conserves_slots(ops, num_slots):
    with HostBuffer.create(slot_bytes=4096, num_slots=num_slots, prefault=False) as buf:
        held = []
        for alloc, pick in ops:
            if alloc:
                if len(held) == num_slots:
                    with pytest.raises(BufferFull):
                        buf.allocate()
                else:
                    held.append(buf.allocate(1 + pick))
            elif held:
                buf.free(held.pop(pick % len(held)))
            buf.check_invariants()
            assert buf.num_used_slots == len(held)
            assert buf.num_free_slots == num_slots - len(held)
            assert len({r.offset_bytes for r in held}) == len(held)  # no slot handed out twice


def test_double_free_and_foreign_regions_are_rejected():
    with HostBuffer.create(4096, 2, prefault=False) as buf:
        r = buf.allocate()
        buf.free(r)
        with pytest.raises(ValueError, match="double free"):
            buf.free(r)
        with pytest.raises(ValueError):
            buf.free(ShmRegion(buf.name, 100, 10))  # not a slot start
        with pytest.raises(ValueError):
            buf.view(ShmRegion("elsewhere", 0, 10))
        with pytest.raises(ValueError):
            buf.allocate(4097)
        buf.check_invariants()


def test_a_region_is_addressable_through_another_mapping_and_close_unlinks():
    buf = HostBuffer.create(1 << 16, 4)
    name = buf.name
    r = buf.allocate(1000)
    buf.view(r)[:] = np.arange(1000) % 251
    segments = SharedSegments()  # attaches by name: a second mapping, as another process would
    other = segments.view(r)
    assert np.array_equal(other, np.arange(1000) % 251)
    other[:10] = 7
    assert buf.view(r)[:10].tolist() == [7] * 10
    del other
    segments.close()
    buf.free(r)
    assert _exists(name)
    buf.close()
    assert not _exists(name)
    with pytest.raises(FileNotFoundError):
        SharedSegments().view(r)
    buf.close()  # idempotent


def test_out_of_range_region_is_rejected():
    with HostBuffer.create(4096, 1, prefault=False) as buf, SharedSegments() as segs:
        with pytest.raises(ValueError):
            segs.view(ShmRegion(buf.name, 4000, 200))
