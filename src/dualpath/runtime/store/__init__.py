"""Persistent KV block store: Full Blocks in files named by their chained digest (store.py),
a checksummed 4096-byte header format (format.py), the storage service over TCP (service.py,
wire.py) and its client (remote.py; store_for picks a directory or a tcp:// URL)."""

from dualpath.runtime.store.errors import (
    BlockFormatError,
    ForeignBlockError,
    InvalidDigestError,
    OutputBufferError,
    PayloadChecksumError,
    PayloadSizeError,
)
from dualpath.runtime.store.format import HEADER_BYTES, BlockHeader, parse_header
from dualpath.runtime.store.results import PutOutcome, PutReport, RefreshReport, StoreStats
from dualpath.runtime.store.store import BlockStore

__all__ = [
    "HEADER_BYTES",
    "BlockFormatError",
    "BlockHeader",
    "BlockStore",
    "ForeignBlockError",
    "InvalidDigestError",
    "OutputBufferError",
    "PayloadChecksumError",
    "PayloadSizeError",
    "PutOutcome",
    "PutReport",
    "RefreshReport",
    "StoreStats",
    "parse_header",
]
