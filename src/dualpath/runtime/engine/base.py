"""What every engine process has: the model, its node's emulated NICs, buffers, store and mail.

An engine process runs one control loop on its main thread. Everything that completes elsewhere
(a storage read on the reader thread, a copy on the CNIC arbiter's thread) posts a message to the
engine's own inbox, so the loop has exactly one place to wait: `EngineBase.pump`. Its timeline
(metrics/timeline.py) travels with its Counters. One concept, what both roles share, past 400 lines.
"""

from __future__ import annotations

import collections
import enum
import gc
import queue
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable
from urllib.parse import urlsplit

import numpy as np
import torch

from ...config import RuntimeConfig
from ...core.blocks import BlockLayout
from ...core.lanes import Lane
from ...metrics.timeline import NULL_TIMELINE, Timeline, engine_tracks, snic_tracks
from ..clock import MonotonicClock
from .device import engine_device, visible_gpus
from ..transport.integrity import FlipInjector, piece_sums
from ..transport.transfer import SpanCopy
from ..model import load_model
from ..protocol import (HEARTBEATS_PER_TIMEOUT, INTEGRITY_COUNTERS, Counters, EngineDown, EngineRole, EngineUp, Heartbeat,
                        Persisted, Reconfigure, Reconfigured)
from ..store import BlockStore, PutOutcome
from ..store.remote import RemoteStore, read_token, store_for

STORED_OUTCOMES = (PutOutcome.WRITTEN, PutOutcome.ALREADY_PRESENT)
# weight of the newest read in the store-latency EWMA (Counters.read_latency_s): a store that turns
# slow is seen within two or three reads, one slow read does not flip the estimate on its own
READ_LATENCY_EWMA_WEIGHT = 0.5
from ..transport import LinkArbiter, ShmRegion, TokenBucket
from ..transport.channel import Inbox, Outbox
from ..transport.messages import Stop, message
from ..transport.shm import SharedSegments
from . import leave
from .peers import peers_for
from .tally import EngineTally
from .tp import start_engine_tp, tp_payload_bytes


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """Everything a spawned engine process needs (picklable)."""

    engine: int
    role: EngineRole
    endpoint: str
    router_endpoint: str
    config: RuntimeConfig
    segments: dict  # node -> (segment name, size in bytes): every node's host buffer
    landing: tuple  # (segment name, size): this PE's landing zone ("HBM"), or () for a DE
    store_root: str
    fingerprint: str
    cpus: tuple = ()  # this process's CPU set (runtime/engine/cpus.py); () = no affinity
    threads: int = 1  # torch threads
    environ: tuple = ()  # the parent's environment at the cluster's start, as (key, value) pairs
    incarnation: int = 0  # which holder of this engine id (Welcome): named in every remote-write hello


@message
@dataclass(frozen=True, slots=True)
class ReadFinished:
    """Reader thread -> own inbox."""

    rid: int
    ok_blocks: int
    nbytes: int


class CopyKind(enum.StrEnum):
    """Which copy of an engine's a `CopyDone` reports."""

    H2D = "h2d"  # DE: the prompt's KV, host buffer -> KV cache
    D2H = "d2h"  # DE: a full block, KV cache -> host, to persist
    PD = "pd"  # PE: one layer's new KV -> the DE's region


@message
@dataclass(frozen=True, slots=True)
class CopyDone:
    """Arbiter thread -> own inbox: a tagged copy finished."""

    rid: int
    kind: CopyKind  # arrives as its str value
    layer: int | None  # the layer of a PD copy; None for whole-prompt copies


def kv_dtype(config: RuntimeConfig) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[config.kv_dtype]


class EngineBase:
    def __init__(self, spec: EngineSpec) -> None:
        self.spec, self.cfg = spec, spec.config
        cfg = self.cfg
        torch.set_num_threads(spec.threads)
        torch.manual_seed(cfg.seed)
        self.device = engine_device(cfg.device, spec.engine, visible_gpus())
        if self.device != "cpu":
            torch.cuda.set_device(self.device)  # this process's default stream and allocations
        self.loaded = load_model(cfg.model, device=self.device, seed=cfg.seed)
        self.model = self.loaded.model
        self.tp = start_engine_tp(self.model, cfg, spec.threads)  # rank 1 (RuntimeConfig.tp), or None
        self.mcfg = self.model.config
        self.dtype = kv_dtype(cfg)
        self.itemsize = torch.tensor([], dtype=self.dtype).element_size()
        self.layout = BlockLayout(self.mcfg.num_layers, cfg.block_tokens, self.mcfg.kv_bytes_per_token_per_layer(self.dtype))
        self.clock = MonotonicClock()
        self.timeline = Timeline(clock=self.clock.now_s) if cfg.record_timeline else NULL_TIMELINE
        self.features = cfg.features
        self._open_nics()
        self.store = self._open_store(spec.store_root)
        self._attached = SharedSegments()
        self.buffers: dict[int, np.ndarray] = {
            int(node): self._attached.view(ShmRegion(name, 0, size)) for node, (name, size) in spec.segments.items()
        }
        self.token = None if cfg.transport.peer_token_file is None else read_token(cfg.transport.peer_token_file)
        self.inbox = Inbox(spec.endpoint, token=self.token)
        self.spec = spec = replace(spec, endpoint=self.inbox.endpoint)  # tcp://HOST:0: the port it bound
        self.node = spec.engine  # every engine is its own node on this runtime
        pe = spec.role == EngineRole.PREFILL  # the timeline's tracks: the engine's index within its role
        self.track, self.cnic_track = engine_tracks(pe, spec.engine - (0 if pe else cfg.num_prefill))
        self.snic_read_track, self.snic_write_track = snic_tracks(self.node)
        self.peers = peers_for(self, cfg.transport.kind == "tcp", self.token,  # at the host its inbox bound
                                urlsplit(spec.endpoint).hostname or "127.0.0.1", spec.engine, spec.incarnation)
        self.peers.expose(spec.segments[self.node][0], self.buffers[self.node])
        self._outboxes: dict[str, Outbox] = {}
        self._out_lock = threading.Lock()
        self.counters = EngineTally()  # per mode: a reconfigure starts a new one
        p = cfg.faults.kv_corrupt_probability
        self.flipper = FlipInjector(p, f"{cfg.seed}:{spec.engine}") if p > 0 else None
        self._reads: queue.Queue = queue.Queue()
        self._writes: queue.Queue = queue.Queue()
        self._stop = False
        self._early: dict[int, list] = {}
        self.lost_engines: set[int] = set()  # peers the router fenced (EngineDown): never wait for them
        self._ended: set[int] = set()
        self._ended_order: collections.deque[int] = collections.deque()
        self._lane_base = (0, 0)
        self._stalled_base_s = 0.0
        self._tp_base_bytes = 0
        self._last_report_s = self.clock.now_s()
        self._handlers = self.handlers()  # the role's table, chosen once
        self._start_threads()
        leave.install(spec.engine, spec.incarnation, self.to_router, self._close_router_box)

    def _open_nics(self) -> None:
        """The node's emulated NICs: the CNIC's arbiter (two lanes, its rate) and the SNIC's read and
        write buckets, a Full Block a burst; the oracle's ablation (io_free) moves bytes at no cost."""
        cfg, io_free = self.cfg, self.features.io_free
        self.arbiter = LinkArbiter(f"cnic{self.spec.engine}", None if io_free else cfg.links.cnic_rate,
                                   cfg.scheduler.lane_weights, self.clock, chunk_bytes=cfg.links.chunk_bytes)
        snic = None if io_free else cfg.links.snic_bytes_per_s
        burst = self.layout.full_block_bytes
        self.snic_read = TokenBucket(snic, burst, self.clock)
        self.snic_write = TokenBucket(snic, burst, self.clock)

    def _start_threads(self) -> None:
        """The store reader and writer, and the heartbeat (each of its own: a forward delays none)."""
        e = self.spec.engine
        self._reader = threading.Thread(target=self._read_loop, name=f"reader{e}", daemon=True)
        self._writer = threading.Thread(target=self._write_loop, name=f"writer{e}", daemon=True)
        self._reader.start()
        self._writer.start()
        self._beating = threading.Event()
        self._heart = threading.Thread(target=self._beat, name=f"heartbeat{e}", daemon=True)
        self._heart.start()

    def _beat(self) -> None:
        """Tell the router this process lives (router/liveness.py), whatever the main loop is doing."""
        interval_s = self.cfg.faults.heartbeat_timeout_s / HEARTBEATS_PER_TIMEOUT
        while not self._beating.wait(interval_s):
            self.to_router(Heartbeat(self.spec.engine))

    def _open_store(self, root: str) -> BlockStore | RemoteStore:
        return store_for(root, self.layout, self.spec.fingerprint, self.cfg.kv_dtype,
                         capacity_bytes=self.cfg.store.capacity_bytes, num_threads=2, direct_io=self.cfg.store.direct_io,
                         timeout_s=self.cfg.store.timeout_s)

    def reconfigure(self, msg: Reconfigure) -> None:
        """Switch mode and store (the router sends this only while idle; reads and writes drain first)."""
        self._reads.join()
        self._writes.join()
        self.cfg = replace(self.cfg, mode=msg.mode)
        self.features = self.cfg.features
        self.store.close()
        self.store = self._open_store(msg.store_root)
        self.counters = EngineTally()  # counters are per mode
        self.timeline.drain()  # spans too: the last mode's went with its Counters
        st = self.arbiter.stats()
        self._lane_base, self._stalled_base_s = st.sent_bytes, st.stalled_s
        self._tp_base_bytes = tp_payload_bytes(self.tp)
        self.on_reconfigured()
        self.to_router(Reconfigured(self.spec.engine, msg.mode))

    def on_reconfigured(self) -> None:
        """Subclasses rebuild what depends on the mode."""

    def own_buffer(self) -> tuple[str, int, str]:
        """(segment name, Full Block slots) of this node's host buffer and where peers write to
        this engine (engine/peers.py), for the Hello."""
        name, size = self.spec.segments[self.node]
        return name, size // self.layout.full_block_bytes, self.peers.data_endpoint

    def attached_view(self, region: ShmRegion) -> np.ndarray:
        """A writable view of a region of any segment on this host (a peer's, on one host)."""
        return self._attached.view(region)

    # --- mail -------------------------------------------------------------------------------
    def send(self, endpoint: str, msg: Any) -> None:
        with self._out_lock:
            box = self._outboxes.get(endpoint)
            if box is None:
                box = self._outboxes[endpoint] = Outbox(endpoint, token=self.token)
        box.send(msg)

    def to_router(self, msg: Any) -> None:
        self.send(self.spec.router_endpoint, msg)

    def _close_router_box(self) -> None:
        """Flush what was sent to the router (the outbox's linger) before the process ends."""
        with self._out_lock:
            box = self._outboxes.pop(self.spec.router_endpoint, None)
        if box is not None:
            box.close()

    def to_self(self, msg: Any) -> None:
        self.send(self.spec.endpoint, msg)

    def pump(self, until: Callable[[], bool], timeout_s: float = 0.05) -> None:
        """Handle messages until `until()` holds (or forever in the idle loop)."""
        while not until() and not self._stop:
            msg = self.inbox.recv(timeout_s)
            if msg is not None:
                self.handle(msg)
            self.maybe_report_counters()

    def serve_queued(self) -> None:
        """Handle the messages already here, waiting for none (a PE between two layers)."""
        while not self._stop and (msg := self.inbox.recv(0)) is not None:
            self.handle(msg)

    def handle(self, msg: Any) -> None:
        """One message, by its type (`handlers`); a type the role does not answer is dropped."""
        handler = self._handlers.get(type(msg))
        if handler is not None:
            handler(msg)

    def handlers(self) -> dict[type, Callable[[Any], None]]:
        """What every engine answers; each role adds its own (`{**super().handlers(), ...}`)."""
        return {EngineDown: self._engine_down, EngineUp: self._engine_up, Reconfigure: self.reconfigure,
                Stop: self._on_stop}

    def _engine_down(self, msg: EngineDown) -> None:
        self.lost_engines.add(msg.engine)  # the router fenced it: never wait for it (its requests come as Cancels)
        self.peers.fence(msg.engine, msg.incarnation)  # a fenced peer that wakes writes nothing here
        self.on_peer_lost()

    def on_peer_lost(self) -> None:
        """What a role does beyond fencing when a peer is lost (prefill: a forward waiting for its layers goes on)."""

    def _engine_up(self, msg: EngineUp) -> None:
        self.lost_engines.discard(msg.engine)  # its successor (router/membership.py): wait for it again

    def _on_stop(self, msg: Stop) -> None:
        self._stop = True

    # --- messages that overtake the assignment they depend on ----------------------------------
    # The router's assignment and a peer's message about the same request travel on different
    # sockets, so a peer's message can arrive first: keep it until the assignment is here.
    def stash(self, rid: int, msg: Any) -> None:
        if rid not in self._ended:
            self._early.setdefault(rid, []).append(msg)

    def replay_stashed(self, rid: int) -> None:
        for msg in self._early.pop(rid, ()):
            self.handle(msg)

    def ended(self, rid: int) -> None:
        self._early.pop(rid, None)
        self._ended.add(rid)
        self._ended_order.append(rid)
        if len(self._ended_order) > 65536:
            self._ended.discard(self._ended_order.popleft())

    # --- storage (the node's SNIC) ------------------------------------------------------------
    def read_blocks(self, rid: int, digests: list[bytes], node: int, offsets: list[int]) -> None:
        """Queue a FIFO read of Full Blocks into slots of `node`'s buffer; ReadFinished follows."""
        self._reads.put((rid, digests, node, offsets))

    def _read_loop(self) -> None:
        fbb = self.layout.full_block_bytes
        busy_since: float | None = None
        while True:
            if self._reads.empty() and busy_since is not None:
                self.counters.read_busy_s += self.clock.now_s() - busy_since
                busy_since = None
            job = self._reads.get()
            if job is None:
                return
            if busy_since is None:
                busy_since = self.clock.now_s()
            rid, digests, node, offsets = job
            read_s = self.timeline.now_s()
            buf = self.buffers[node]
            ok = 0
            for d, off in zip(digests, offsets):
                self.snic_read.consume(fbb)
                t0 = self.clock.now_s()
                if not ok and self.cfg.faults.store_read_delay_s:
                    time.sleep(self.cfg.faults.store_read_delay_s)  # fault injection: a slow store
                got = self.store.read_into([bytes(d)], buf[off : off + fbb])
                if not ok:
                    self._sample_read_latency(self.clock.now_s() - t0)
                if got != 1:
                    break  # a block that fails its checksum is never used: the hit ends here
                ok += 1
            self.counters.storage_read_bytes += ok * fbb
            self.timeline.until_now(self.snic_read_track, "read", read_s, rid)
            self.to_self(ReadFinished(rid, ok, ok * fbb))
            self._reads.task_done()

    def persist(self, digest: bytes, payload: np.ndarray, queued_s: float) -> None:
        """Write one Full Block (a private copy) to storage through the node's SNIC (announced at `queued_s`)."""
        self._writes.put((digest, payload, queued_s))

    def _write_loop(self) -> None:
        while True:
            job = self._writes.get()
            if job is None:
                return
            digest, payload, queued_s = job
            write_s = self.timeline.now_s()
            self.snic_write.consume(len(payload))
            try:
                stored = self.store.put(digest, payload) in STORED_OUTCOMES
            except OSError:
                stored = False  # e.g. ENOSPC: the block is not persisted, serving goes on
            self.counters.storage_write_bytes += len(payload)
            self.timeline.until_now(self.snic_write_track, "persist", write_s, None, {"wait_s": write_s - queued_s})
            self.to_router(Persisted(self.spec.engine, bytes(digest), stored))
            self._writes.task_done()

    # --- copies over the CNIC ------------------------------------------------------------------
    def copy(self, src: np.ndarray, src_spans: list, dst: np.ndarray, dst_spans: list, on_done: Callable[[Any], None] | None,
             lane: Lane = Lane.KV):
        job = SpanCopy(src, src_spans, dst, dst_spans)
        return self.arbiter.submit(lane, job.nbytes, job, on_done)

    def copy_checked(self, src: np.ndarray, src_spans: list, dst: np.ndarray, dst_spans: list,
                     on_done: Callable[[list[int]], None]) -> list[int]:
        """`copy` on a checked path (a layer stream or PD transfer): the sender's sums of the source
        bytes (destination offsets relative to `dst`, transport/integrity.py) are returned and
        handed to `on_done` on the link's thread once the bytes are there. With fault injection on,
        the link may flip bits of them in flight."""
        job = SpanCopy(src, src_spans, dst, dst_spans)
        sums = piece_sums(job)
        chunk = job if self.flipper is None else self.flipper.wrap(job)
        if chunk is not job:
            self.counters.kv_flips_injected += chunk.num_flips
        self.arbiter.submit(Lane.KV, job.nbytes, chunk, lambda _res: on_done(sums))
        return sums

    def _sample_read_latency(self, seconds: float) -> None:
        c = self.counters
        c.read_latency_s = seconds if not c.read_latency_s else (
            READ_LATENCY_EWMA_WEIGHT * seconds + (1 - READ_LATENCY_EWMA_WEIGHT) * c.read_latency_s)

    def maybe_report_counters(self, every_s: float = 0.5) -> None:
        now = self.clock.now_s()
        if now - self._last_report_s >= every_s:
            self._last_report_s = now
            self.report_counters()

    def report_counters(self) -> None:
        st, c = self.arbiter.stats(), self.counters
        kv, lc = Lane.KV, Lane.LATENCY_CRITICAL
        self.to_router(Counters(
            engine=self.spec.engine, storage_read_bytes=int(c.storage_read_bytes),
            storage_write_bytes=int(c.storage_write_bytes), read_busy_s=float(c.read_busy_s), cnic_kv_bytes=int(st.sent_bytes[kv] - self._lane_base[kv]),
            cnic_lc_bytes=int(st.sent_bytes[lc] - self._lane_base[lc] + tp_payload_bytes(self.tp) - self._tp_base_bytes),  # + the collectives
            busy_s=float(c.busy_s), forwards=int(c.forwards), **{k: int(getattr(c, k)) for k in INTEGRITY_COUNTERS},
            read_latency_s=float(c.read_latency_s), remote_write_bytes=self.peers.sent_bytes(),
            store_skipped_calls=sum(getattr(self.store, "skipped_calls", dict)().values()),
            forward_items=int(c.forward_items), served_mid_step=int(c.served_mid_step),
            fit_terms=(float(c.fit_items), float(c.fit_ctx), float(c.fit_keys)),
            cnic_stalled_s=float(st.stalled_s - self._stalled_base_s),
            control_bytes=self.control_bytes_sent(), spans=self.timeline.drain()))

    def control_bytes_sent(self) -> int:
        """The encoded bytes of the messages sent to other processes (the router, peers), to itself not."""
        with self._out_lock:
            return sum(box.sent_bytes for endpoint, box in self._outboxes.items() if endpoint != self.spec.endpoint)

    def close(self) -> None:
        self._stop = True
        self._reads.put(None)
        self._writes.put(None)
        self._writer.join(timeout=30)
        self.arbiter.close()
        self.report_counters()
        if self.tp is not None:
            self.tp.close()
        self.peers.close()
        self._beating.set()  # beats until the outboxes close
        self._heart.join(timeout=5)
        with self._out_lock:
            for box in self._outboxes.values():
                box.close()
        self.inbox.close()
        self.store.close()
        # drop every view into the shared segments before unmapping them
        self.buffers.clear()
        self.release_views()
        gc.collect()
        try:
            self._attached.close()
        except BufferError:
            pass  # a view is still referenced somewhere; the process exit unmaps it

    def release_views(self) -> None:
        """Subclasses drop their own views into shared memory here."""


def as_tensor(buf: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A torch view (no copy) of bytes in a host buffer."""
    return torch.frombuffer(memoryview(buf), dtype=dtype).view(shape)
