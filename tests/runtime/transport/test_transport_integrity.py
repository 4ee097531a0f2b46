"""Checksum framing of checked copies (transport/integrity.py): a clean copy passes, one flipped
bit in any piece is caught at that piece, and the injector is deterministic and off when unused."""

import numpy as np
import pytest

from dualpath.core.lanes import Lane, LaneWeights
from dualpath.runtime.clock import MonotonicClock
from dualpath.runtime.transport import LinkArbiter, SpanCopy
from dualpath.runtime.transport.integrity import SUM_FIELDS, FlipInjector, bad_pieces, checksum, piece_sums

BLOCK = 4096  # bytes of one piece (a Layer Block of the tiny model is 16 KiB; the size does not matter)


def _blocks(num: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, num * BLOCK, dtype=np.uint8)


def _scattered_copy(src: np.ndarray, dst: np.ndarray) -> SpanCopy:
    """Blocks of `src` (contiguous) into every other slot of `dst`, as a PD transfer scatters a
    layer into a DE region's Full Block slots."""
    num = src.size // BLOCK
    return SpanCopy(src, [(0, src.size)], dst, [(2 * b * BLOCK, BLOCK) for b in range(num)])


def test_clean_copy_passes_and_sums_name_each_destination_piece():
    src, dst = _blocks(3), np.zeros(6 * BLOCK, np.uint8)
    job = _scattered_copy(src, dst)
    sums = piece_sums(job)
    assert sums[0::SUM_FIELDS] == [0, 2 * BLOCK, 4 * BLOCK] and sums[1::SUM_FIELDS] == [BLOCK] * 3
    assert sums[2::SUM_FIELDS] == [checksum(src[b * BLOCK:(b + 1) * BLOCK]) for b in range(3)]
    assert bad_pieces(dst, sums) == [0, 1, 2]  # nothing copied yet: every piece differs
    job(0, job.nbytes)
    assert bad_pieces(dst, sums) == []


@pytest.mark.parametrize("piece,byte,bit", [(0, 0, 0), (1, BLOCK // 2, 7), (2, BLOCK - 1, 3)])
def test_one_flipped_bit_is_caught_in_its_piece_only(piece, byte, bit):
    src, dst = _blocks(3, seed=piece), np.zeros(6 * BLOCK, np.uint8)
    job = _scattered_copy(src, dst)
    sums = piece_sums(job)
    job(0, job.nbytes)
    dst[2 * piece * BLOCK + byte] ^= 1 << bit
    assert bad_pieces(dst, sums) == [piece]


def test_receiver_verifies_within_its_own_view_and_rejects_out_of_range_sums():
    src, landing = _blocks(2), np.zeros(8 * BLOCK, np.uint8)
    at = 3 * BLOCK  # the item's offset in the landing zone
    dst = landing[at:at + src.size]
    job = SpanCopy(src, [(0, BLOCK), (BLOCK, BLOCK)], dst, [(0, src.size)])
    sums = piece_sums(job)
    job(0, job.nbytes)
    assert bad_pieces(landing, sums, at) == []
    assert bad_pieces(landing, sums, at + 1) == [0, 1]
    assert bad_pieces(landing, sums, landing.size) == [0, 1]  # past the end: a failure, never an IndexError


def test_injector_flips_one_bit_per_chosen_piece_through_a_real_link():
    src = _blocks(8)
    dst = np.zeros(16 * BLOCK, np.uint8)
    job = _scattered_copy(src, dst)
    sums = piece_sums(job)
    inj = FlipInjector(1.0, seed="0:1")
    chunk = inj.wrap(job)
    assert chunk is not job and chunk.num_flips == 8 == inj.num_flipped
    link = LinkArbiter("cnic-test", None, LaneWeights(), MonotonicClock(), chunk_bytes=1000)  # chunks cut pieces
    try:
        link.submit(Lane.KV, job.nbytes, chunk).wait(10)
    finally:
        link.close()
    assert bad_pieces(dst, sums) == list(range(8))
    diff = np.flatnonzero(dst[np.concatenate([np.arange(2 * b * BLOCK, (2 * b + 1) * BLOCK) for b in range(8)])] != src)
    assert len(diff) == 8  # exactly one byte per piece
    assert all(bin(int(x)).count("1") == 1 for x in (dst[[2 * (i // BLOCK) * BLOCK + i % BLOCK for i in diff]] ^ src[diff]))


def test_injector_is_deterministic_per_seed_and_rate():
    def flips(seed: str, p: float) -> list:
        inj = FlipInjector(p, seed)
        out = []
        for k in range(50):
            c = inj.wrap(_scattered_copy(_blocks(4), np.zeros(8 * BLOCK, np.uint8)))
            out.append(getattr(c, "_flips", None))
        return out

    assert flips("0:2", 0.3) == flips("0:2", 0.3)
    assert flips("0:2", 0.3) != flips("0:3", 0.3)
    n = sum(len(f) for f in flips("0:2", 0.3) if f)
    assert 0.2 * 200 < n < 0.4 * 200  # 200 pieces at p = 0.3
    with pytest.raises(ValueError):
        FlipInjector(0.0, 1)
