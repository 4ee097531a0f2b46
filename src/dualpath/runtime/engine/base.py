"""What every engine process has: the model, its node's CNIC (a `LinkArbiter`), host buffers, its
storage client (storage.py: the SNIC, the store, reader and writer threads) and its mail
(mailbox.py), and what it counts (tally.py), reported to the router as Counters with its timeline.

An engine process runs one control loop on its main thread. Everything that completes elsewhere
(a storage read on the reader thread, a copy on the CNIC arbiter's thread) posts a message to the
engine's own inbox, so the loop has exactly one place to wait: `EngineBase.pump`.
"""

from __future__ import annotations

import enum
import gc
import threading
from dataclasses import dataclass, replace
from typing import Any, Callable
from urllib.parse import urlsplit

import numpy as np
import torch

from ...config import RuntimeConfig
from ...core.blocks import BlockLayout
from ...core.lanes import Lane
from ...metrics.timeline import NULL_TIMELINE, Timeline, engine_tracks
from ..clock import MonotonicClock
from .device import engine_device, visible_gpus
from ..transport.integrity import FlipInjector, piece_sums
from ..transport.transfer import SpanCopy
from ..model import load_model
from ..protocol import (HEARTBEATS_PER_TIMEOUT, INTEGRITY_COUNTERS, Counters, EngineDown, EngineRole, EngineUp, Heartbeat,
                        Reconfigure, Reconfigured)
from ..store.remote import read_token
from ..transport import LinkArbiter, ShmRegion
from ..transport.messages import Stop, message
from ..transport.shm import SharedSegments
from . import leave
from .mailbox import Mailbox
from .peers import peers_for
from .storage import NodeStorage, ReadFinished
from .tally import EngineTally
from .tp import start_engine_tp, tp_payload_bytes

# at Stop or a mode switch: the CNIC's queued copies (the last steps' D2H persist copies, a few Full
# Blocks; the cluster is idle) may take this long to land (at Stop, the rest are then failed)
STOP_COPIES_DRAIN_S = 30.0


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


__all__ = ["CopyDone", "CopyKind", "EngineBase", "EngineSpec", "ReadFinished", "as_tensor", "kv_dtype"]


class CopyKind(enum.StrEnum):
    """Which copy of an engine's a `CopyDone` reports."""

    H2D = "h2d"  # DE: the prompt's KV, host buffer -> KV cache
    D2H = "d2h"  # DE: a full block, KV cache -> host, to persist
    PD = "pd"  # PE: one layer's new KV -> the DE's region
    RELAY = "relay"  # PE: a local request's hit, read here, -> its DE's region (+selective)


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
        # the CNIC: two lanes at its rate; the oracle's ablation (io_free) moves bytes at no cost
        self.arbiter = LinkArbiter(f"cnic{spec.engine}", None if self.features.io_free else cfg.links.cnic_rate,
                                   cfg.scheduler.lane_weights, self.clock, chunk_bytes=cfg.links.chunk_bytes)
        self._attached = SharedSegments()
        self.buffers: dict[int, np.ndarray] = {
            int(node): self._attached.view(ShmRegion(name, 0, size)) for node, (name, size) in spec.segments.items()
        }
        self.token = None if cfg.transport.peer_token_file is None else read_token(cfg.transport.peer_token_file)
        self.mail = Mailbox(spec.endpoint, spec.router_endpoint, self.token)
        self.spec = spec = replace(spec, endpoint=self.mail.endpoint)  # tcp://HOST:0: the port it bound
        self.node = spec.engine  # every engine is its own node on this runtime
        self.counters = EngineTally()  # per mode: a reconfigure starts a new one
        self.storage = NodeStorage(cfg, spec.engine, self.layout, spec.fingerprint, spec.store_root, self.clock,
                                   self.timeline, self.buffers, lambda: self.counters, self.mail.to_self, self.mail.to_router)
        pe = spec.role == EngineRole.PREFILL  # the timeline's tracks: the engine's index within its role
        self.track, self.cnic_track = engine_tracks(pe, spec.engine - (0 if pe else cfg.num_prefill))
        self.peers = peers_for(self, cfg.transport.kind == "tcp", self.token,  # at the host its inbox bound
                                urlsplit(spec.endpoint).hostname or "127.0.0.1", spec.engine, spec.incarnation,
                                cfg.transport)
        self.peers.expose(spec.segments[self.node][0], self.buffers[self.node])
        p = cfg.faults.kv_corrupt_probability
        self.flipper = FlipInjector(p, f"{cfg.seed}:{spec.engine}") if p > 0 else None
        self._stop = False
        self.lost_engines: set[int] = set()  # peers the router fenced (EngineDown): never wait for them
        self._lane_base = (0, 0)
        self._stalled_base_s = 0.0
        self._tp_base_bytes = 0
        self._last_report_s = self.clock.now_s()
        self._handlers = self.handlers()  # the role's table, chosen once
        self._beating = threading.Event()  # the heartbeat, a thread of its own: a forward delays no beat
        self._heart = threading.Thread(target=self._beat, name=f"heartbeat{spec.engine}", daemon=True)
        self._heart.start()
        leave.install(spec.engine, spec.incarnation, self.mail.to_router, self.mail.close_router_box)

    def _beat(self) -> None:
        """Tell the router this process lives (router/liveness.py), whatever the main loop is doing."""
        interval_s = self.cfg.faults.heartbeat_timeout_s / HEARTBEATS_PER_TIMEOUT
        while not self._beating.wait(interval_s):
            self.mail.to_router(Heartbeat(self.spec.engine))

    def reconfigure(self, msg: Reconfigure) -> None:
        """Switch mode and store (the router sends this only while idle; reads and writes drain first)."""
        self.arbiter.drain(STOP_COPIES_DRAIN_S)  # the last persists' copies go to the old store, not the new
        self.cfg = replace(self.cfg, mode=msg.mode)
        self.features = self.cfg.features
        self.storage.reopen(self.cfg, msg.store_root)
        self.counters = EngineTally()  # counters are per mode
        self.timeline.drain()  # spans too: the last mode's went with its Counters
        st = self.arbiter.stats()
        self._lane_base, self._stalled_base_s = st.sent_bytes, st.stalled_s
        self._tp_base_bytes = tp_payload_bytes(self.tp)
        self.on_reconfigured()
        self.mail.to_router(Reconfigured(self.spec.engine, msg.mode))

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

    # --- mail ------------------------------------------------------------------------------
    def pump(self, until: Callable[[], bool], timeout_s: float = 0.05) -> None:
        """Handle messages until `until()` holds (or forever in the idle loop)."""
        while not until() and not self._stop:
            msg = self.mail.recv(timeout_s)
            if msg is not None:
                self.handle(msg)
            self.maybe_report_counters()

    def serve_queued(self) -> None:
        """Handle the messages already here, waiting for none (a PE between two layers)."""
        while not self._stop and (msg := self.mail.recv(0)) is not None:
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

    def replay_held(self, rid: int) -> None:
        """Handle the messages that came before `rid`'s assignment (mailbox.py), now that it is here."""
        for msg in self.mail.take_held(rid):
            self.handle(msg)

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

    def maybe_report_counters(self, every_s: float = 0.5) -> None:
        now = self.clock.now_s()
        if now - self._last_report_s >= every_s:
            self._last_report_s = now
            self.report_counters()

    def report_counters(self, final: bool = False) -> None:
        """What this engine moved and did, cumulative over the mode; `final`: its last report (it stops)."""
        st, c = self.arbiter.stats(), self.counters
        kv, lc = Lane.KV, Lane.LATENCY_CRITICAL
        self.mail.to_router(Counters(
            engine=self.spec.engine, storage_read_bytes=int(c.storage_read_bytes),
            storage_write_bytes=int(c.storage_write_bytes), read_busy_s=float(c.read_busy_s), cnic_kv_bytes=int(st.sent_bytes[kv] - self._lane_base[kv]),
            cnic_lc_bytes=int(st.sent_bytes[lc] - self._lane_base[lc] + tp_payload_bytes(self.tp) - self._tp_base_bytes),  # + the collectives
            busy_s=float(c.busy_s), forwards=int(c.forwards), **{k: int(getattr(c, k)) for k in INTEGRITY_COUNTERS},
            read_latency_s=float(c.read_latency_s), remote_write_bytes=self.peers.sent_bytes(),
            dram_read_bytes=int(c.dram_read_bytes),
            store_skipped_calls=self.storage.skipped_calls(),
            forward_items=int(c.forward_items), served_mid_step=int(c.served_mid_step),
            fit_terms=(float(c.fit_items), float(c.fit_ctx), float(c.fit_keys)),
            cnic_stalled_s=float(st.stalled_s - self._stalled_base_s),
            control_bytes=self.mail.control_bytes_sent(), spans=self.timeline.drain(), final=final))

    def close(self) -> None:
        self._stop = True
        # the queued copies first: a persist's D2H copy hands its block to the writer when it lands
        self.arbiter.close(drain_s=STOP_COPIES_DRAIN_S)
        self.storage.stop(on_wait=self.report_counters)
        self.report_counters(final=True)
        if self.tp is not None:
            self.tp.close()
        self.peers.close()
        self._beating.set()  # beats until the outboxes close
        self._heart.join(timeout=5)
        self.mail.close()
        self.storage.close()
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
