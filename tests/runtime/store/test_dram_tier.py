"""An engine node's DRAM tier (runtime/store/dram_tier.py): blocks by digest, LRU by bytes, and a block
whose bytes no longer match their CRC32 never used."""

from __future__ import annotations

import numpy as np

from dualpath.runtime.store.dram_tier import DramTier

BLOCK = 256


def _block(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, BLOCK, dtype=np.uint8)


def test_a_held_block_is_copied_out_and_the_oldest_use_is_evicted_first():
    tier = DramTier(capacity_bytes=2 * BLOCK)
    a, b, c = _block(1), _block(2), _block(3)
    tier.put(b"a", a)
    tier.put(b"b", b)
    a[:] = 0  # the tier holds its own copy
    out = np.zeros(BLOCK, dtype=np.uint8)
    assert tier.read_into(b"a", out) and np.array_equal(out, _block(1)) and tier.hits == 1
    tier.put(b"c", c)  # b, the least recently used, goes
    assert not tier.read_into(b"b", out) and len(tier) == 2
    assert tier.read_into(b"c", out) and np.array_equal(out, c)
    tier.check_invariants()
    tier.clear()
    assert len(tier) == 0 and not tier.read_into(b"a", out)


def test_a_block_that_fails_its_crc_is_dropped_and_not_copied():
    tier = DramTier(capacity_bytes=4 * BLOCK)
    tier.put(b"a", _block(1))
    tier._blocks[b"a"][0][7] ^= 0x10  # one bit flipped in DRAM
    out = np.full(BLOCK, 9, dtype=np.uint8)
    assert not tier.read_into(b"a", out)
    assert (out == 9).all() and tier.bad == 1 and len(tier) == 0  # nothing copied, the entry gone
    tier.check_invariants()


def test_a_private_block_is_kept_without_a_copy_and_a_wrong_size_is_never_copied():
    tier = DramTier(capacity_bytes=4 * BLOCK)
    mine = _block(4)
    tier.put(b"p", mine, private=True)
    assert tier._blocks[b"p"][0] is mine
    assert not tier.read_into(b"p", np.zeros(BLOCK // 2, dtype=np.uint8)) and tier.bad == 1
