"""An engine node's storage client: its SNIC, the KV store, and a reader and a writer thread.

  1. Reads (`read_blocks`): a FIFO of read jobs; the reader thread reads each job's Full Blocks into
     slots of a host buffer, each block through the SNIC's read bucket (a Full Block a burst). A
     block that fails its checksum ends the job there: the hit is recomputed from that block on.
     `ReadFinished` goes to the engine's own inbox; the first block's time feeds the store-latency
     estimate (Counters.read_latency_s).
  2. Writes (`persist`): a FIFO of Full Blocks; the writer thread puts each through the SNIC's write
     bucket into the store and tells the router (`Persisted`: stored, or not, e.g. a full disk).
  3. With `+dram` (store/dram_tier.py) both fill the node's DRAM tier, and a read takes a block the
     tier holds from there (no SNIC, counted as `dram_read_bytes`) before it asks the store. After
     each read job and each persist the tier's changes go to the router (`DramChanged`), one
     report at a time, so the router's copy (router/dram_index.py) follows the tier in its order.
  4. A mode switch (`reopen`) waits for both queues to drain, then opens the new store (and a new
     tier, empty, if the new mode has one).
The threads report through the engine's tally (`tally()`: the current mode's) and its timeline.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...config import RuntimeConfig
from ...core.blocks import BlockLayout
from ...metrics.timeline import Timeline, snic_tracks
from ..clock import Clock
from ..protocol import DramChanged, Persisted
from ..store import BlockStore, PutOutcome
from ..store.dram_tier import DramTier
from ..store.remote import RemoteStore, store_for
from ..transport import TokenBucket
from ..transport.messages import message
from .tally import EngineTally

STORED_OUTCOMES = (PutOutcome.WRITTEN, PutOutcome.ALREADY_PRESENT)
# weight of the newest read in the store-latency EWMA (Counters.read_latency_s): a store that turns
# slow is seen within two or three reads, one slow read does not flip the estimate on its own
READ_LATENCY_EWMA_WEIGHT = 0.5
# at shutdown (`stop`): the writer drains its queued persists while the engine reports its counters
# every STOP_REPORT_S (the period of its reports while it serves, engine/base.py), for as long as one
# persist ends at least every STOP_STALL_S. One store call gives up after `store.timeout_s` (5 s by
# default) and a tripped breaker answers at once, so 30 s without one is a writer that hangs
STOP_REPORT_S = 0.5
STOP_STALL_S = 30.0


@message
@dataclass(frozen=True, slots=True)
class ReadFinished:
    """Reader thread -> own inbox."""

    rid: int
    ok_blocks: int
    nbytes: int  # what crossed the SNIC (a block from the DRAM tier did not)


class NodeStorage:
    def __init__(self, cfg: RuntimeConfig, engine: int, layout: BlockLayout, fingerprint: str, store_root: str,
                 clock: Clock, timeline: Timeline, buffers: dict[int, np.ndarray], tally: Callable[[], EngineTally],
                 to_self: Callable[[Any], None], to_router: Callable[[Any], None]) -> None:
        self._cfg, self._engine, self._layout, self._fingerprint = cfg, engine, layout, fingerprint
        self._clock, self._timeline, self._buffers, self._tally = clock, timeline, buffers, tally
        self._to_self, self._to_router = to_self, to_router
        self._read_track, self._write_track = snic_tracks(engine)  # every engine is its own node
        snic = None if cfg.features.io_free else cfg.links.snic_bytes_per_s  # the oracle's reads cost nothing
        # Reads: no burst, so a job of n blocks holds the read link n block-times, idle before or
        # not, as the simulator's link (a burst of one block let an idle node's first block pass at
        # once: the runtime read each hit one block-time faster than the simulator, ~0.1 s of the
        # tiny CPU rates, `dualpath fidelity --timeline`); `_read_job` overlaps the store's own
        # time with the link's. Writes: one block of burst (sim/persists.py models it).
        self.snic_read = TokenBucket(snic, 0, clock)
        self.snic_write = TokenBucket(snic, layout.full_block_bytes, clock)
        self.store = self._open(store_root)
        self.dram = self._tier(cfg)
        self._dram_count = threading.Lock()  # the engine's thread and the reader both count DRAM reads
        self._dram_report = threading.Lock()  # one tier report at a time: the router applies them in order
        self._reads: queue.Queue = queue.Queue()
        self._writes: queue.Queue = queue.Queue()
        self.writes_done = 0  # persists the writer finished (stored or not); only it counts
        self._reader = threading.Thread(target=self._read_loop, name=f"reader{engine}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"writer{engine}", daemon=True)
        self._reader.start()
        self._writer.start()

    def _open(self, root: str) -> BlockStore | RemoteStore:
        s = self._cfg.store
        return store_for(root, self._layout, self._fingerprint, self._cfg.kv_dtype, capacity_bytes=s.capacity_bytes,
                         num_threads=2, direct_io=s.direct_io, timeout_s=s.timeout_s)

    @staticmethod
    def _tier(cfg: RuntimeConfig) -> DramTier | None:
        """The mode's DRAM tier, chosen once per mode: `+dram`'s, else none."""
        return DramTier(int(cfg.store.dram_tier_mb * 2**20)) if cfg.features.dram_tier else None

    # 1. reads
    def read_blocks(self, rid: int, digests: list[bytes], node: int, offsets: list[int]) -> None:
        """Queue a FIFO read of Full Blocks into slots of `node`'s buffer; ReadFinished follows. A read
        the DRAM tier holds whole is copied now, ahead of the queue (it needs no SNIC)."""
        if self.dram is not None and digests and self._from_dram(rid, digests, node, offsets):
            return
        self._reads.put((rid, digests, node, offsets))

    def _from_dram(self, rid: int, digests: list[bytes], node: int, offsets: list[int]) -> bool:
        """Copy every block from the tier; False (nothing reported) if one is missing or bad by now."""
        tier, fbb, buf = self.dram, self._layout.full_block_bytes, self._buffers[node]
        assert tier is not None
        read_s = self._timeline.now_s()
        if not all(tier.read_into(bytes(d), buf[off : off + fbb]) for d, off in zip(digests, offsets)):
            self._report_tier()  # a block dropped for its CRC32
            return False  # the reader reads it (the blocks still held come from the tier again)
        self._counted_dram(len(digests))
        self._timeline.until_now(self._read_track, "read", read_s, rid)
        self._to_self(ReadFinished(rid, len(digests), 0))
        return True

    def _read_loop(self) -> None:
        busy_since: float | None = None
        while True:
            if self._reads.empty() and busy_since is not None:
                self._tally().read_busy_s += self._clock.now_s() - busy_since
                busy_since = None
            job = self._reads.get()
            if job is None:
                return
            if busy_since is None:
                busy_since = self._clock.now_s()
            self._read_job(*job)
            self._reads.task_done()

    def _read_job(self, rid: int, digests: list[bytes], node: int, offsets: list[int]) -> None:
        fbb = self._layout.full_block_bytes
        read_s = self._timeline.now_s()
        buf = self._buffers[node]
        delay_s = self._cfg.faults.store_read_delay_s
        tier = self.dram
        ok = from_dram = 0
        for d, off in zip(digests, offsets):
            if tier is not None and tier.read_into(bytes(d), buf[off : off + fbb]):
                ok += 1  # from the node's DRAM: no SNIC
                from_dram += 1
                continue
            t0 = self._clock.now_s()
            due_s = t0 + self.snic_read.reserve(fbb)  # when the block's bytes have crossed the link
            if not ok and delay_s:
                time.sleep(delay_s)  # fault injection: a slow store
            got = self.store.read_into([bytes(d)], buf[off : off + fbb])
            if not ok:
                self._sample_latency(self._clock.now_s() - t0)
            self._clock.sleep_s(max(0.0, due_s - self._clock.now_s()))  # the store's time within the link's
            if got != 1:
                break  # a block that fails its checksum is never used: the hit ends here
            ok += 1
            if tier is not None:
                tier.put(bytes(d), buf[off : off + fbb])
        self._tally().storage_read_bytes += (ok - from_dram) * fbb
        self._counted_dram(from_dram)
        if tier is not None:
            self._report_tier()
        self._timeline.until_now(self._read_track, "read", read_s, rid)
        self._to_self(ReadFinished(rid, ok, (ok - from_dram) * fbb))

    def _counted_dram(self, num_blocks: int) -> None:
        with self._dram_count:
            self._tally().dram_read_bytes += num_blocks * self._layout.full_block_bytes

    def _sample_latency(self, seconds: float) -> None:
        c = self._tally()
        c.read_latency_s = seconds if not c.read_latency_s else (
            READ_LATENCY_EWMA_WEIGHT * seconds + (1 - READ_LATENCY_EWMA_WEIGHT) * c.read_latency_s)

    # 2. writes
    def persist(self, digest: bytes, payload: np.ndarray, queued_s: float) -> None:
        """Write one Full Block (a private copy) to storage through the node's SNIC (announced at `queued_s`);
        with `+dram` it is in the node's tier from now on (the copy, shared: neither side writes it)."""
        if self.dram is not None:
            self.dram.put(bytes(digest), payload, private=True)
            self._report_tier()
        self._writes.put((digest, payload, queued_s))

    def _report_tier(self) -> None:
        """Send the tier's changes since the last report, if any (drained and sent under one lock:
        the reader's reports and the engine thread's reach the router in the order they were drained)."""
        tier = self.dram
        if tier is None:
            return
        with self._dram_report:
            held, dropped = tier.drain_changes()
            if held or dropped:
                self._to_router(DramChanged(self._engine, held, dropped))

    def _write_loop(self) -> None:
        while True:
            job = self._writes.get()
            if job is None:
                return
            digest, payload, queued_s = job
            write_s = self._timeline.now_s()
            self.snic_write.consume(len(payload))
            try:
                stored = self.store.put(digest, payload) in STORED_OUTCOMES
            except OSError:
                stored = False  # e.g. ENOSPC: the block is not persisted, serving goes on
            self._tally().storage_write_bytes += len(payload)
            self._timeline.until_now(self._write_track, "persist", write_s, None, {"wait_s": write_s - queued_s})
            self._to_router(Persisted(self._engine, bytes(digest), stored))
            self.writes_done += 1
            self._writes.task_done()

    # 3. a mode switch, and the end
    def reopen(self, cfg: RuntimeConfig, store_root: str) -> None:
        """Drain reads and writes, then open the store at `store_root` under `cfg` (the new mode)."""
        self._reads.join()
        self._writes.join()
        self._cfg = cfg
        self.store.close()
        self.store = self._open(store_root)
        self.dram = self._tier(cfg)

    def skipped_calls(self) -> int:
        """Calls a storage service's breaker skipped (store/breaker.py); 0 for a local store."""
        return sum(getattr(self.store, "skipped_calls", dict)().values())

    def stop(self, on_wait: Callable[[], None] = lambda: None) -> None:
        """End both threads once their queues are done: the writer's queued persists land first, for
        as long as they progress (a writer that completes none for STOP_STALL_S is left behind: a
        dead store). `on_wait` runs every STOP_REPORT_S meanwhile (the engine reports its counters:
        the router sees the drain go on, and every persist that landed is in its ledger)."""
        self._reads.put(None)
        self._writes.put(None)
        done, since_s = self.writes_done, self._clock.now_s()
        while True:
            self._writer.join(timeout=STOP_REPORT_S)
            if not self._writer.is_alive():
                return
            on_wait()
            if self.writes_done != done:
                done, since_s = self.writes_done, self._clock.now_s()
            elif self._clock.now_s() - since_s > STOP_STALL_S:
                return

    def close(self) -> None:
        self.store.close()
