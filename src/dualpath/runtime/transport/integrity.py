"""A checksum per block on the KV paths that cross a link, and the hook that flips bytes in flight.

Who checks what (the sender checksums the bytes it sends; the receiver verifies before use):
  - layer streams (engine/kv_stream.py): layer l of a batch item's cached KV into the PE's
    landing zone, from the PE's own node buffer (PE path) or from the DE's buffer on a
    `LayerPull` (DE path; the sums ride back in `LayerReady`). The PE verifies the landed bytes
    before the layer computes; a mismatch is pulled again (LAYER_RETRANSMITS_MAX), then the
    request's KV is recomputed from its tokens.
  - PD transfers: every layer's new KV (and, PE path, the hit) into the DE's region. The PE lists
    the sums in `PromptReady`; the DE verifies its region before the H2D copy and recomputes the
    prompt's KV itself on a mismatch (engine/decode.py): the PE's copies are gone by then.
  - on disk: the store's CRC32 per Full Block (store/format.py) checks every read into a host
    buffer, so the bytes a stream starts from are already verified. A stream sends one layer's
    slice of a block, so it cannot reuse the file's whole-block checksum.

Unit: one piece of a `SpanCopy` (an aligned run within one source and one destination span). On
these paths the spans are cut at block boundaries, so a piece is one Layer Block, or the part of
one that a prefill chunk covers. Sums travel as a flat list of ints, three per piece:
(destination offset_bytes relative to the receiver's view, nbytes, checksum).

Checksum: xxh3_64 (xxhash 4.1.0), the fastest of zlib.crc32, google-crc32c, crc32c, xxh64 and
xxh3_64 over Layer and Full Blocks of the tiny model and SmolLM2 on the development VM (16-31 GB/s
against 8-14 GB/s for the CRC32Cs and 2.3-4.1 GB/s for zlib; `dualpath bench checksum`,
docs/results/checksum/checksum.json). It detects corruption, not an adversary (64 bits, not keyed).
"""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np
import xxhash

from .transfer import SpanCopy

_checksum = xxhash.xxh3_64_intdigest
SUM_FIELDS = 3  # (dst offset_bytes, nbytes, checksum) per piece
# A layer load that fails its check is pulled again at most this many times, then the request's
# KV is recomputed. Three: a damaged piece costs at most three more layer loads on the link (the
# forward waits for them), and at a 10% flip rate per piece a 4-block load fails 34% of tries, so
# 4 tries in a row fail 1.4% of the time: recompute stays rare even under heavy injection.
LAYER_RETRANSMITS_MAX = 3


def checksum(buf: np.ndarray) -> int:
    """The 64-bit checksum of a contiguous uint8 array."""
    return _checksum(buf)


def piece_sums(job: SpanCopy) -> list[int]:
    """The sender's sums of a copy, from its source bytes, with the pieces' destination offsets
    (relative to the copy's destination array). The source must be a host (numpy) array."""
    src = job.src
    out: list[int] = []
    for _, so, do, n in job.pieces:
        out += (do, n, _checksum(src[so : so + n]))
    return out


def bad_pieces(view: np.ndarray, sums: Sequence[int], base_bytes: int = 0) -> list[int]:
    """Indices of the pieces whose bytes in `view[base_bytes + offset ...]` do not match `sums`."""
    bad = []
    for i in range(0, len(sums), SUM_FIELDS):
        off, n, want = sums[i], sums[i + 1], sums[i + 2]
        start = base_bytes + off
        if start < 0 or start + n > view.size or _checksum(view[start : start + n]) != want:
            bad.append(i // SUM_FIELDS)
    return bad


class FlipInjector:
    """Fault injection: each piece of a checked copy gets one bit flipped in its destination, after
    the arbiter has copied it, with probability `probability` (RuntimeConfig.faults.kv_corrupt_probability).
    Deterministic: one RNG per engine, seeded, drawn on the submitting thread in submission order.
    Built only when the probability is positive, so a run without faults pays nothing for it."""

    def __init__(self, probability: float, seed: int | str) -> None:
        if not 0.0 < probability <= 1.0:
            raise ValueError(f"probability must be in (0, 1], got {probability}")
        self.probability = probability
        self._rng = random.Random(seed)
        self.num_flipped = 0

    def wrap(self, job: SpanCopy) -> SpanCopy | "FlippingCopy":
        """`job` itself, or `job` with the flips drawn for its pieces (a `do_chunk` for the arbiter)."""
        flips = []
        for start, _, do, n in job.pieces:
            if self._rng.random() < self.probability:
                at = self._rng.randrange(n)
                flips.append((start + at, do + at, 1 << self._rng.randrange(8)))
        if not flips:
            return job
        self.num_flipped += len(flips)
        return FlippingCopy(job, flips)


class FlippingCopy:
    """A SpanCopy whose chosen bytes are XORed in the destination right after the chunk holding
    them is copied: the damage a link does in flight, before the receiver is told the bytes landed."""

    __slots__ = ("job", "nbytes", "_flips")

    def __init__(self, job: SpanCopy, flips: list[tuple[int, int, int]]) -> None:
        if not isinstance(job.dst, np.ndarray):
            raise TypeError("only host-buffer destinations are checked, so only they are flipped")
        self.job, self.nbytes = job, job.nbytes
        self._flips = flips  # (logical offset, dst offset, bit mask), in stream order

    @property
    def num_flips(self) -> int:
        return len(self._flips)

    def __call__(self, offset_bytes: int, nbytes: int) -> None:
        self.job(offset_bytes, nbytes)
        end = offset_bytes + nbytes
        dst = self.job.dst
        for logical, at, mask in self._flips:
            if offset_bytes <= logical < end:
                dst[at] ^= mask
