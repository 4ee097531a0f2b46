"""Block header format: round trip and one specific error per kind of damage."""

import struct
import zlib

import pytest

from dualpath.core.blocks import BlockLayout
from dualpath.runtime.store.errors import (
    BadMagicError,
    DigestMismatchError,
    ForeignBlockError,
    HeaderChecksumError,
    HeaderFieldError,
    PayloadChecksumError,
    UnsupportedVersionError,
)
from dualpath.runtime.store.format import HEADER_BYTES, BlockHeader, make_header, parse_header

LAYOUT = BlockLayout(3, 64, 768)
DIGEST = bytes(range(32))
PAYLOAD = bytes(range(256)) * (LAYOUT.full_block_bytes // 256)


def header() -> BlockHeader:
    return make_header("f" * 64, "bfloat16", LAYOUT, DIGEST, PAYLOAD)


def resealed(raw: bytes | bytearray) -> bytes:
    """Recompute the header CRC after editing a field, so the field check itself is reached."""
    raw = bytearray(raw)
    raw[-4:] = struct.pack("<I", zlib.crc32(raw[:-4]))
    return bytes(raw)


def test_round_trip_keeps_every_field():
    raw = header().encode()
    assert len(raw) == HEADER_BYTES
    parsed = parse_header(raw)
    assert parsed == header()
    assert parsed.payload_bytes == LAYOUT.full_block_bytes == 3 * 64 * 768
    assert parsed.payload_crc32 == zlib.crc32(PAYLOAD)


def test_bad_magic():
    raw = bytearray(header().encode())
    raw[0] ^= 1
    with pytest.raises(BadMagicError):
        parse_header(raw)


@pytest.mark.parametrize("offset", [9, 20, 40, 80, 300, 4000, 4093])
def test_any_flipped_header_byte_fails_the_header_crc(offset):
    raw = bytearray(header().encode())
    raw[offset] ^= 0x10
    with pytest.raises(HeaderChecksumError):
        parse_header(raw)


def test_other_version_with_sound_crc_is_foreign_not_corrupt():
    raw = bytearray(header().encode())
    raw[8:10] = struct.pack("<H", 2)
    with pytest.raises(UnsupportedVersionError) as info:
        parse_header(resealed(raw))
    assert isinstance(info.value, ForeignBlockError)


@pytest.mark.parametrize(
    "offset, value, words",
    [
        (32, struct.pack("<Q", 12345), "payload_bytes"),
        (16, struct.pack("<I", 0), "layout"),
        (12, struct.pack("<I", 512), "header_bytes"),
        (72, struct.pack("<H", 0), "fingerprint length"),
        (300, b"\x01", "reserved"),
        (74 + 2 + 128 + 20, b"x", "dtype padding"),
    ],
)
def test_each_field_is_validated(offset, value, words):
    raw = bytearray(header().encode())
    raw[offset : offset + len(value)] = value
    with pytest.raises(HeaderFieldError, match=words.split()[0]):
        parse_header(resealed(raw))


def test_short_buffer_is_a_field_error():
    with pytest.raises(HeaderFieldError):
        parse_header(header().encode()[:100])


def test_payload_checksum_catches_one_flipped_byte_and_a_wrong_length():
    h = header()
    h.verify_payload(PAYLOAD)
    bad = bytearray(PAYLOAD)
    bad[len(bad) // 2] ^= 1
    with pytest.raises(PayloadChecksumError):
        h.verify_payload(bad)
    with pytest.raises(PayloadChecksumError):
        h.verify_payload(PAYLOAD[:-1])


def test_check_matches_tells_foreign_from_misplaced():
    h = header()
    h.check_matches("f" * 64, "bfloat16", LAYOUT, DIGEST)
    with pytest.raises(ForeignBlockError):
        h.check_matches("e" * 64, "bfloat16", LAYOUT, DIGEST)
    with pytest.raises(ForeignBlockError):
        h.check_matches("f" * 64, "float16", LAYOUT, DIGEST)
    with pytest.raises(ForeignBlockError):
        h.check_matches("f" * 64, "bfloat16", BlockLayout(3, 64, 512), DIGEST)
    with pytest.raises(DigestMismatchError):
        h.check_matches("f" * 64, "bfloat16", LAYOUT, bytes(32))


@pytest.mark.parametrize("fingerprint", ["", "x" * 129, "tab\there", "é" * 4])
def test_bad_fingerprints_are_refused(fingerprint):
    with pytest.raises(HeaderFieldError):
        BlockHeader(fingerprint, "bfloat16", LAYOUT, DIGEST, 0)
