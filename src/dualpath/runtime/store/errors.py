"""Errors of the KV block store.

Two families, because the store treats them differently:

- `BlockFormatError`: the bytes on disk are not a valid block (torn, flipped, truncated,
  misplaced). The store never uses such a block: it drops it from the index and quarantines
  the file.
- `ForeignBlockError`: a valid block written for another model, dtype or layout. It is not
  ours to use, and not ours to delete either: the store ignores it and leaves the file alone.
"""

from __future__ import annotations


class BlockFormatError(Exception):
    """A block file is corrupt or malformed; the message names the file (when known) and field."""


class BadMagicError(BlockFormatError):
    """The header does not start with the block magic: not a block file at all."""


class HeaderChecksumError(BlockFormatError):
    """The header's own CRC32 does not match its bytes."""


class HeaderFieldError(BlockFormatError):
    """A header field (named in the message) is out of range or inconsistent."""


class TruncatedBlockError(BlockFormatError):
    """The file is shorter than its header says (a torn write or a truncated copy)."""


class DigestMismatchError(BlockFormatError):
    """The header's digest is not the digest the file is named by."""


class PayloadChecksumError(BlockFormatError):
    """The payload's CRC32 does not match the header."""


class ForeignBlockError(Exception):
    """A valid block of another model fingerprint, dtype or layout."""


class UnsupportedVersionError(ForeignBlockError):
    """A block with a valid header CRC in a format version this code does not read (written by
    another version of dualpath sharing the directory): foreign, so ignored and never deleted."""


class InvalidDigestError(ValueError):
    """A block digest that is not exactly 32 bytes (or a name that is not 64 hex characters):
    refused before any path is built from it."""


class PayloadSizeError(ValueError):
    """`put` got a payload that is not exactly one Full Block."""


class OutputBufferError(ValueError):
    """`read_into` got a buffer that is read-only, non-contiguous or too small."""
