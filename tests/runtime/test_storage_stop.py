"""A node's writer at shutdown (engine/storage.py `stop`): every queued persist lands, the engine
reporting as it goes; a writer whose store hangs is left behind after the stall bound."""

from __future__ import annotations

import threading

import numpy as np

from dualpath.config import LinkConfig, RuntimeConfig
from dualpath.core.blocks import BlockLayout
from dualpath.metrics.timeline import NULL_TIMELINE
from dualpath.runtime.clock import MonotonicClock
from dualpath.runtime.engine import storage as storage_mod
from dualpath.runtime.engine.storage import NodeStorage
from dualpath.runtime.engine.tally import EngineTally

LAYOUT = BlockLayout(num_layers=2, block_tokens=4, kv_bytes_per_token_per_layer=1000)  # 8 KB Full Blocks


def _storage(tmp_path, snic_bytes_per_s: float) -> tuple[NodeStorage, EngineTally, list]:
    cfg = RuntimeConfig(model="tiny", links=LinkConfig(snic_bytes_per_s=snic_bytes_per_s, cnic_bytes_per_s=1e9))
    tally, to_router = EngineTally(), []
    s = NodeStorage(cfg, 0, LAYOUT, "fp", str(tmp_path), MonotonicClock(), NULL_TIMELINE, {}, lambda: tally,
                    lambda msg: None, to_router.append)
    return s, tally, to_router


def _blocks(n: int) -> list[tuple[bytes, np.ndarray]]:
    return [(bytes([i]) * 32, np.full(LAYOUT.full_block_bytes, i, dtype=np.uint8)) for i in range(n)]


def test_stop_lands_every_queued_persist_and_reports_while_it_drains(tmp_path):
    s, tally, to_router = _storage(tmp_path, 80_000)  # 8 KB blocks: ~0.1 s each, ~0.8 s for 8
    for digest, payload in _blocks(8):
        s.persist(digest, payload, 0.0)
    reports = []
    s.stop(on_wait=lambda: reports.append(tally.storage_write_bytes))
    assert s.writes_done == 8 and tally.storage_write_bytes == 8 * LAYOUT.full_block_bytes
    assert len(to_router) == 8 and all(m.stored for m in to_router)
    assert reports and reports == sorted(reports) and reports[0] < 8 * LAYOUT.full_block_bytes  # seen mid-drain
    s.close()


def test_a_writer_whose_store_hangs_is_left_after_the_stall_bound(tmp_path, monkeypatch):
    monkeypatch.setattr(storage_mod, "STOP_STALL_S", 0.3)
    s, tally, _ = _storage(tmp_path, 1e9)
    release = threading.Event()
    s.store.put = lambda digest, payload: release.wait(30)  # a store that no longer answers
    for digest, payload in _blocks(3):
        s.persist(digest, payload, 0.0)
    clock = MonotonicClock()
    t0 = clock.now_s()
    s.stop()
    assert 0.3 <= clock.now_s() - t0 < 3.0 and s.writes_done == 0
    release.set()
