"""Digests and paths are validated: a digest that is not 32 bytes is refused with a clear error
before any path is built from it, so nothing outside the store's root is ever read or written."""

from __future__ import annotations

import os

import pytest
from store_helpers import FILE_BYTES, LAYOUT, chain, files_under, open_store, path_of, payloads

from dualpath.runtime.store import InvalidDigestError, PutOutcome, files

FB = LAYOUT.full_block_bytes
HOSTILE = [b"../../../../etc/passwd", b"", b"\x00" * 31, b"\x00" * 33, "../../outside", "ab" * 32, 32, None]


@pytest.fixture
def root(tmp_path):
    """The store's root one level below tmp_path, so a write outside it would show."""
    return tmp_path / "root"


@pytest.mark.parametrize("digest", HOSTILE, ids=repr)
def test_a_malformed_digest_is_refused_before_any_io(tmp_path, root, digest):
    victim = tmp_path / "etc" / "passwd"
    victim.parent.mkdir()
    victim.write_bytes(b"root:x:0:0")
    with open_store(root) as store:
        before = files_under(tmp_path)
        good = chain(2)
        for call in (lambda: store.put(digest, payloads(1)[0]),
                     lambda: store.put_many([(good[0], payloads(1)[0]), (digest, payloads(1)[0])]),
                     lambda: store.lookup([good[0], digest]),
                     lambda: store.read_into([digest], bytearray(FB)),
                     lambda: files.block_path(str(root), digest)):
            with pytest.raises(InvalidDigestError, match="block digest"):
                call()
        # put_many checks every digest before writing any block; nothing moved anywhere
        assert files_under(tmp_path) == before and store.stats().num_blocks == 0
        assert victim.read_bytes() == b"root:x:0:0"
        store.check_invariants()


def test_a_digest_of_traversal_bytes_is_named_by_its_hex_inside_the_root(root):
    digest = (b"../" * 11)[:32]  # 32 bytes: a valid digest, whatever its bytes spell
    with open_store(root) as store:
        assert store.put(digest, payloads(1)[0]) is PutOutcome.WRITTEN
        assert files_under(root) == [f"2e/{digest.hex()}.kvb"]
        assert os.path.commonpath([path_of(store, digest), str(root)]) == str(root)
        out = bytearray(FB)
        assert store.read_into([digest], out) == 1 and bytes(out) == payloads(1)[0]


@pytest.mark.parametrize("text", ["../../../../etc/passwd", "AB" * 32, "ab" * 31, "ab" * 32 + "/", "g" * 64, ""])
def test_digest_from_hex_takes_only_64_lowercase_hex_characters(text):
    with pytest.raises(InvalidDigestError, match="not a block digest"):
        files.digest_from_hex(text)


def test_digest_from_hex_round_trips():
    digest = chain(1)[0]
    assert files.digest_from_hex(digest.hex()) == digest


def test_a_symlink_out_of_the_root_is_never_used_nor_followed_on_quarantine(tmp_path, root):
    """A block name that points elsewhere (someone with write access to the root): its target is
    not a block, so it is not indexed; quarantine moves the link, never the file it points to."""
    outside = tmp_path / "secret"
    outside.write_bytes(b"s" * FILE_BYTES)
    digest = chain(1)[0]
    with open_store(root) as store:
        link = path_of(store, digest)
        os.makedirs(os.path.dirname(link))
        os.symlink(outside, link)
        assert store.lookup([digest]) == 0 and store.read_into([digest], bytearray(FB)) == 0
    with open_store(root) as again:  # the startup scan meets it: not a sound block, quarantined
        assert again.stats().num_blocks == 0 and again.stats().header_failures == 1
    assert outside.read_bytes() == b"s" * FILE_BYTES and not os.path.lexists(link)
