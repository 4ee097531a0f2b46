import hashlib
import struct

import pytest

from dualpath.core.blocks import (
    ROOT_DIGEST,
    BlockLayout,
    block_digest,
    chain_digests,
    join_layer_blocks,
    longest_stored_prefix,
    salted_root,
    split_full_block,
)


def test_digest_is_sha256_of_parent_and_le_uint32_tokens():
    expected = hashlib.sha256(b"\x00" * 32 + b"\x01\x00\x00\x00\x02\x00\x00\x00").digest()
    assert block_digest(ROOT_DIGEST, [1, 2]) == expected


def test_chain_skips_partial_block_and_links_parents():
    tokens = list(range(10))
    d = chain_digests(tokens, block_tokens=4)
    assert len(d) == 2  # 10 tokens -> 2 full blocks of 4, 2 tokens left over
    assert d[0] == block_digest(ROOT_DIGEST, [0, 1, 2, 3])
    assert d[1] == hashlib.sha256(d[0] + struct.pack("<4I", 4, 5, 6, 7)).digest()


def test_changing_a_token_changes_its_block_and_all_later_ones_only():
    a = list(range(16))
    b = list(a)
    b[9] = 999  # block 2 of size 4 (tokens 8..11)
    da, db = chain_digests(a, 4), chain_digests(b, 4)
    assert da[:2] == db[:2]
    assert all(x != y for x, y in zip(da[2:], db[2:]))


def test_a_cache_salt_changes_every_key_of_the_chain():
    """salted_root: block 0's parent, so every block key differs under another salt; no salt is the
    plain chain; the same salt is the same chain."""
    tokens = list(range(12))
    plain = chain_digests(tokens, 4)
    assert salted_root("") == ROOT_DIGEST and chain_digests(tokens, 4, salted_root("")) == plain
    a, b = chain_digests(tokens, 4, salted_root("a")), chain_digests(tokens, 4, salted_root("b"))
    assert a == chain_digests(tokens, 4, salted_root("a"))
    assert not set(a) & set(b) and not set(a) & set(plain)
    assert a[0] == block_digest(salted_root("a"), [0, 1, 2, 3]) and len(salted_root("a")) == 32


def test_longest_stored_prefix_stops_at_first_gap():
    d = chain_digests(list(range(20)), 4)
    assert longest_stored_prefix(d, {d[0], d[1], d[3]}) == 2
    assert longest_stored_prefix(d, set()) == 0
    assert longest_stored_prefix(d, set(d)) == 5


def test_token_ids_must_fit_four_bytes():
    with pytest.raises(ValueError):
        block_digest(ROOT_DIGEST, [2**32])


def test_layout_full_block_is_layer_blocks_back_to_back():
    lay = BlockLayout(num_layers=3, block_tokens=4, kv_bytes_per_token_per_layer=5)
    assert lay.layer_block_bytes == 20
    assert lay.full_block_bytes == 60
    assert lay.kv_bytes_per_token == 15
    assert lay.layer_range(2) == (40, 60)
    assert lay.token_range(1, 3) == (35, 40)
    full = bytes(range(60))
    parts = split_full_block(lay, full)
    assert [bytes(p) for p in parts] == [full[0:20], full[20:40], full[40:60]]
    assert join_layer_blocks(lay, parts) == full
    with pytest.raises(IndexError):
        lay.layer_range(3)
    with pytest.raises(ValueError):
        split_full_block(lay, full[:-1])
