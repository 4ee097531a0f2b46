"""The router's copy of each node's DRAM tier (`+dram`, router/dram_index.py) is the tier's own
contents: the tier logs what it came to hold and dropped (store/dram_tier.py `drain_changes`), the
node's storage client reports it after every read job and persist (engine/storage.py `DramChanged`),
and the copy applies the reports in order."""

from __future__ import annotations

import random
import time

import numpy as np
import pytest

from dualpath.config import LinkConfig, RuntimeConfig, StoreConfig
from dualpath.core.blocks import BlockLayout
from dualpath.metrics.timeline import NULL_TIMELINE
from dualpath.runtime.clock import MonotonicClock
from dualpath.runtime.engine.storage import NodeStorage, ReadFinished
from dualpath.runtime.engine.tally import EngineTally
from dualpath.runtime.protocol import DramChanged
from dualpath.runtime.router.dram_index import DramIndex
from dualpath.runtime.store.dram_tier import DramTier

BLOCK = 64


def _digest(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


def _payload(i: int, size: int = BLOCK) -> np.ndarray:
    return np.full(size, i % 251, dtype=np.uint8)


def test_reports_applied_in_order_make_the_copy_hold_exactly_what_the_tier_holds():
    """500 random puts, reads, bit flips and clears on a 5-block tier, drained at random moments:
    after every drain the copy equals the tier's digests, and it never holds more than the tier fits."""
    rng = random.Random(7)
    tier = DramTier(5 * BLOCK)
    copy = DramIndex(5 * BLOCK, BLOCK, block_tokens=4)
    out = np.empty(BLOCK, dtype=np.uint8)
    drains = 0
    for _ in range(500):
        op, i = rng.random(), rng.randrange(12)
        if op < 0.5:
            tier.put(_digest(i), _payload(i))
        elif op < 0.8:
            tier.read_into(_digest(i), out)
        elif op < 0.95:
            held = tier._blocks.get(_digest(i))
            if held is not None:
                held[0][0] ^= 1  # a bit flipped in DRAM: the next read drops the block
            tier.read_into(_digest(i), out)
        else:
            tier.clear()
        if rng.random() < 0.3:
            copy.changed(0, *tier.drain_changes())
            drains += 1
            assert {d for d in map(_digest, range(12)) if copy.holds(0, d)} == tier.digests()
            copy.check_invariants()
    assert drains > 100 and tier.bad > 0


def test_a_persist_announced_counts_as_held_until_a_report_names_it():
    copy = DramIndex(2 * BLOCK, BLOCK, block_tokens=4)
    a, b, c = _digest(1), _digest(2), _digest(3)
    copy.persist_queued(7, [a, b])
    assert copy.held_tokens(7, [a, b, c], 12) == 8 and copy.held_tokens(8, [a], 4) == 0
    copy.changed(7, [a], [])  # a entered the tier; b not reported yet: still expected
    assert copy.holds(7, a) and copy.holds(7, b)
    copy.changed(7, [c], [a, b])  # b was put and evicted before the report: gone, as a and its expectation
    assert not copy.holds(7, a) and not copy.holds(7, b) and copy.holds(7, c)
    assert copy.held_tokens(7, [a, b, c], 10) == 2  # the last block is short: 2 of its 4 tokens
    copy.engine_lost(7)
    assert copy.held_tokens(7, [c], 4) == 0


def test_a_copy_larger_than_the_tier_fails_its_check():
    copy = DramIndex(2 * BLOCK, BLOCK, block_tokens=4)
    copy.changed(0, [_digest(i) for i in range(3)], [])
    with pytest.raises(AssertionError, match="more than the tier's 2"):
        copy.check_invariants()


LAYOUT = BlockLayout(num_layers=2, block_tokens=4, kv_bytes_per_token_per_layer=1000)  # 8 KB Full Blocks


@pytest.mark.parametrize("seed", [1, 2])
def test_a_nodes_reports_track_its_tier_through_reads_and_persists(tmp_path, seed):
    """A node with a 3-block tier persists 6 blocks and reads 3 jobs that mix blocks in the tier,
    blocks only in storage and one that was never stored: the reports it sent the router, applied
    in order, hold what its tier holds after every job, and each report says what changed."""
    fbb = LAYOUT.full_block_bytes
    cfg = RuntimeConfig(model="tiny", mode="dualpath+dram", store=StoreConfig(dram_tier_mb=3 * fbb / 2**20),
                        links=LinkConfig(snic_bytes_per_s=1e9, cnic_bytes_per_s=1e9))
    to_router: list = []
    finished: list = []
    buf = np.zeros(8 * fbb, dtype=np.uint8)
    s = NodeStorage(cfg, 4, LAYOUT, "fp", str(tmp_path), MonotonicClock(), NULL_TIMELINE, {4: buf},
                    EngineTally, finished.append, to_router.append)
    copy = DramIndex(3 * fbb, fbb, LAYOUT.block_tokens)

    def sync() -> None:
        for msg in to_router:
            if isinstance(msg, DramChanged):
                assert msg.engine == 4 and (msg.held or msg.dropped)
                copy.changed(msg.engine, msg.held, msg.dropped)
        to_router.clear()
        assert {d for d in map(_digest, range(10)) if copy.holds(4, d)} == s.dram.digests()

    for i in range(6):
        s.persist(_digest(i), _payload(i, fbb), 0.0)
        sync()  # a persist reports at once
    s.stop()  # every block written
    s.close()
    s = NodeStorage(cfg, 4, LAYOUT, "fp", str(tmp_path), MonotonicClock(), NULL_TIMELINE, {4: buf},
                    EngineTally, finished.append, to_router.append)  # the same store, an empty tier
    copy.engine_lost(4)
    rng = random.Random(seed)
    for job in range(3):
        digests = [_digest(i) for i in rng.sample(range(6), 3)] + ([_digest(9)] if job == 1 else [])
        s.read_blocks(job, digests, 4, [k * fbb for k in range(len(digests))])
        deadline = time.monotonic() + 10
        while not any(isinstance(m, ReadFinished) and m.rid == job for m in finished):
            assert time.monotonic() < deadline
            time.sleep(0.005)
        sync()  # the job's report went out before its ReadFinished
    assert len(s.dram.digests()) == 3 and _digest(9) not in s.dram.digests()
    s.stop()
    s.close()
