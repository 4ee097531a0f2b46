"""The router: applies the one scheduling pass to the live cluster and streams tokens back. It owns
the truth the pass needs (engine loads, node read queues, HBM reservations, host-buffer slots) and
changes it only on its event loop; a receiver thread hands each engine message to the loop.

Numbered path of one request through the router (the engines' side is in protocol.py):
  1. `generate` -> `admit`: tokens in, an id out; the request joins the global FIFO queue.
  2. A scheduling pass (coalesced, after any change): `core.scheduler.GlobalScheduler` picks the
     PE (Algorithm 1 or round robin), the DE (two phases with HBM fit) and the read side (shorter
     node read queue, counting the request's hit: the longest stored prefix of chained block
     digests); `_apply` books the loads and read queues.
  3. `_place` (placement.py): host-buffer regions (DE region always; PE region on the PE path),
     after any block of the prompt still being persisted lands. A request that finds no buffer
     room waits, in FIFO order, for the next pass.
  4. `DecodeAssign` to the DE, `PrefillAssign` to the PE.
  5. `FirstToken` / `Token` become `TokenEvent`s; `ReadDone`, `PrefillDone`, `PromptLoaded`,
     `DecodeDone` shrink read queues, PE loads, regions and HBM reservations, and advance `phase`.
  6. A consumer that stops iterating cancels the request on every engine it touched.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import replace
from typing import Any, AsyncIterator

from ...config import RuntimeConfig
from ...core.phase import Phase
from ...core.request import RequestId
from ...core.scheduler import ClusterView, GlobalScheduler, SchedulePass, SchedulerRules, derive_thresholds
from ...core.snapshot import QueuedRequest, ReadSide
from ...errors import InputError
from ...metrics.prometheus import Family
from ..api import GenerationRequest, TokenEvent
from ..protocol import (Cancel, Counters, DecodeAssign, EngineRole, DecodeDone, FirstToken, Hello, PersistQueued, Persisted,
                        PrefillAssign, PrefillDone, PromptLoaded, ReadDone, Reconfigure, Reconfigured, Token)
from ..transport.channel import Inbox, Outbox
from ..transport.shm import HostBuffer
from .metrics import QueueGauges, RouterMetrics
from .placement import Placement
from .state import EngineState, RouterRequest, RouterView, check_ledgers


class Router:
    def __init__(self, config: RuntimeConfig, *, model_name: str, tokenizer: Any, max_context_tokens: int,
                 eos_token_ids: tuple[int, ...], kv_bytes_per_token: int, full_block_bytes: int,
                 buffers: dict[int, HostBuffer], store: Any, endpoint: str, clock: Any) -> None:
        self.cfg = config
        self.features = config.features
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.max_context_tokens = max_context_tokens
        self.eos_token_ids = eos_token_ids
        self.kv_bytes_per_token = kv_bytes_per_token
        self.full_block_bytes = full_block_bytes
        self.buffers = buffers
        self.placement = Placement(store, buffers, config.block_tokens)
        self.clock = clock
        self.engines: dict[int, EngineState] = {}
        self.requests: dict[int, RouterRequest] = {}
        self.view: ClusterView = RouterView(self.engines, self.placement, kv_bytes_per_token)
        self.scheduler: GlobalScheduler | None = None  # built when every engine has said hello
        self.unscheduled: deque[RouterRequest] = deque()  # arrived before the scheduler existed
        self.placing: deque[RouterRequest] = deque()  # both engines chosen, waiting for buffer room
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pass_pending = False
        self.metrics = RouterMetrics(clock)
        self.inbox = Inbox(endpoint)
        self.endpoint = endpoint
        self._stop = threading.Event()
        self._receiver = threading.Thread(target=self._receive, name="router-inbox", daemon=True)
        self._expected_engines = config.num_prefill + config.num_decode
        self._reconfigured: set[int] = set()

    @property
    def store(self) -> Any:
        return self.placement.store

    # --- life cycle ------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._receiver.start()

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = self.clock.now_s() + timeout_s
        while len(self.engines) < self._expected_engines:
            if self.clock.now_s() > deadline:
                raise RuntimeError(f"only {len(self.engines)} of {self._expected_engines} engines came up")
            await asyncio.sleep(0.05)
        self._new_scheduler()

    def stop(self) -> None:
        self._stop.set()
        self._receiver.join(timeout=5)
        for e in self.engines.values():
            if e.outbox is not None:
                e.outbox.close()
        self.inbox.close()

    def _receive(self) -> None:
        while not self._stop.is_set():
            msg = self.inbox.recv(0.05)
            if msg is not None and self._loop is not None:
                self._loop.call_soon_threadsafe(self._on_message, msg)

    def _new_scheduler(self) -> None:
        """alpha from the configured SNIC rate, beta from the slowest PE's profiled rate
        (derive_thresholds); the mode's rules; the engines as groups of one."""
        cfg = self.cfg
        pes = sorted(e.engine for e in self.engines.values() if e.role == EngineRole.PREFILL)
        des = sorted(e.engine for e in self.engines.values() if e.role == EngineRole.DECODE)
        rate = min(self.engines[e].prefill_tokens_per_s for e in pes)
        snic = None if self.features.io_free else cfg.snic_bytes_per_s
        thresholds = derive_thresholds(cfg.scheduler.alpha_read_s, cfg.scheduler.beta_compute_s, snic, self.kv_bytes_per_token, rate)
        forced = None if cfg.force_read_side is None else ReadSide.DECODE if cfg.force_read_side == "decode" else ReadSide.PREFILL
        rules = SchedulerRules(thresholds, self.features.dualpath_scheduler, self.features.de_read_path, cfg.scheduler.z_factor, forced)
        self.scheduler = GlobalScheduler(pes, des, rules)
        self.metrics.engine_index = {e: i for ids in (pes, des) for i, e in enumerate(ids)}
        while self.unscheduled:
            rr = self.unscheduled.popleft()
            self.scheduler.submit(rr.qview, rr)
        self._kick()

    async def reconfigure(self, mode: str, store: Any, store_root: str, timeout_s: float = 120.0) -> None:
        """Switch every engine and the router to `mode` on a fresh store; only while idle."""
        if self.requests:
            raise RuntimeError("reconfigure needs an idle cluster")
        self._reconfigured = set()
        for e in self.engines.values():
            e.outbox.send(Reconfigure(mode, store_root))
        deadline = self.clock.now_s() + timeout_s
        while len(self._reconfigured) < len(self.engines):
            if self.clock.now_s() > deadline:
                raise RuntimeError("engines did not acknowledge the new mode")
            await asyncio.sleep(0.02)
        self.cfg = replace(self.cfg, mode=mode)
        self.features = self.cfg.features
        self.placement.store = store
        self.metrics = RouterMetrics(self.clock)
        self._new_scheduler()

    # --- 1. requests ------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        rr = self.admit(request)
        try:
            while True:
                ev: TokenEvent = await rr.queue.get()
                yield ev
                if ev.finished:
                    return
        finally:
            if not rr.finished:
                self._cancel(rr)

    def admit(self, request: GenerationRequest) -> RouterRequest:
        """Check the request and queue it for the next pass (InputError names what is wrong)."""
        n = len(request.prompt_ids)
        if n == 0:
            raise InputError("prompt is empty")
        if n + request.params.max_tokens > self.max_context_tokens:
            raise InputError(f"prompt ({n} tokens) + max_tokens ({request.params.max_tokens}) exceeds the context window "
                             f"({self.max_context_tokens} tokens)")
        if n + request.params.max_tokens > self.cfg.de_kv_tokens:
            raise InputError(f"prompt + max_tokens exceeds a decode engine's KV cache ({self.cfg.de_kv_tokens} tokens)")
        rid = next(self._ids)
        bt = self.cfg.block_tokens
        total = -(-(n + request.params.max_tokens) // bt) * bt
        qview = QueuedRequest(RequestId(rid, 0), n, total * self.kv_bytes_per_token, total)
        rr = RouterRequest(rid, request, asyncio.Queue(), self.clock.now_s(), total, qview)
        self.requests[rid] = rr
        if self.scheduler is None:
            self.unscheduled.append(rr)
        else:
            self.scheduler.submit(qview, rr)
        self.metrics.arrived(rid)
        self._kick()
        return rr

    def _cancel(self, rr: RouterRequest) -> None:
        rr.finished = rr.cancelled = True
        self.metrics.cancelled(rr.rid)
        if rr in self.unscheduled:
            self.unscheduled.remove(rr)
        if rr.de is None and self.scheduler is not None:
            self.scheduler.cancel(rr.qview.rid)
        if rr in self.placing:
            self.placing.remove(rr)
        for e in (rr.pe, rr.de):
            if e is not None and e.outbox is not None:
                e.outbox.send(Cancel(rr.rid))
        if not rr.placed:  # nothing was sent: undo what the pass booked
            if rr.pe is not None:
                self._pe_release(rr)
            if rr.de is not None:
                self._de_release(rr)
                self._read_ended(rr)
            self.requests.pop(rr.rid, None)
        self._kick()

    # --- 2. scheduling ------------------------------------------------------------------------------
    def _kick(self) -> None:
        if not self._pass_pending and self._loop is not None:
            self._pass_pending = True
            self._loop.call_soon(self._pass)

    def _pass(self) -> None:
        self._pass_pending = False
        if self.scheduler is None:
            return
        self._apply(self.scheduler.schedule(self.view))
        self._place()

    def _apply(self, p: SchedulePass) -> None:
        for a in p.prefill:
            rr: RouterRequest = a.ref
            rr.pe = self.engines[a.engine]
            rr.advance(Phase.PE_ASSIGNED)
            rr.pe.num_seqs += 1
            rr.pe.num_tokens += rr.qview.num_tokens
            self.metrics.pe_assigned(rr.rid)
        for d in p.decode:
            rr = d.ref
            rr.de = de = self.engines[d.engine]
            de.num_seqs += 1
            de.num_tokens += rr.total_tokens
            de.kv_reserved_tokens += rr.total_tokens
            rr.side = d.side
            rr.read_charged_tokens = d.read_tokens
            rr.side_engine.read_queue_tokens += d.read_tokens
            self.placing.append(rr)
            self.metrics.de_assigned(rr, int(d.side), d.read_tokens)

    # --- 3. placement and assignment ----------------------------------------------------------------
    def _place(self) -> None:
        while self.placing:
            rr = self.placing[0]
            if not self._try_place(rr):
                return  # FIFO: wait for buffer room
            self.placing.popleft()

    def _try_place(self, rr: RouterRequest) -> bool:
        prompt = list(rr.req.prompt_ids)
        stored = self.placement.store.lookup(rr.digests)  # a persist may have landed since the pass
        if self._wait_for_persist(rr, prompt, stored):
            return False
        regions = self.placement.allocate_regions(rr.pe.engine, rr.de.engine, len(prompt), rr.side)
        if regions is None:
            return False
        rr.de_regions, rr.pe_regions = regions
        hit = self.placement.hit_tokens(prompt, stored)
        rr.side_engine.read_queue_tokens += hit - rr.read_charged_tokens
        rr.hit_tokens = rr.read_charged_tokens = hit
        rr.advance(Phase.READING if hit else Phase.PREFILL_READY)
        self._send_assignments(rr, prompt)
        self.metrics.placed(rr.rid, hit, rr.side)
        return True

    def _send_assignments(self, rr: RouterRequest, prompt: list[int]) -> None:
        p, hit, side = rr.req.params, rr.hit_tokens, int(rr.side)
        seed = p.seed if p.seed is not None else rr.rid
        hit_digests = rr.digests[: hit // self.cfg.block_tokens]
        de_offsets = [r.offset_bytes for r in rr.de_regions]
        rr.de.outbox.send(DecodeAssign(rr.rid, prompt, hit, hit_digests, side, rr.pe.endpoint, de_offsets,
                                       p.max_tokens, p.min_tokens, p.ignore_eos, p.temperature, p.top_p, seed))
        rr.pe.outbox.send(PrefillAssign(rr.rid, prompt, hit, hit_digests, side, rr.de.engine, rr.de.endpoint,
                                        self.buffers[rr.de.engine].name, de_offsets, [r.offset_bytes for r in rr.pe_regions],
                                        p.temperature, p.top_p, seed, p.min_tokens > 0 or p.ignore_eos,
                                        self.features.layerwise_prefill))

    def _wait_for_persist(self, rr: RouterRequest, prompt: list[int], stored: int) -> bool:
        """True while the block after the stored prefix is still being written by a DE (PAPER.md
        A.4: a turn hits the client's whole earlier context). `Persisted` kicks the next pass; after
        `persist_wait_s` the request goes on with what is stored (a write that never reports)."""
        if not self.placement.blocked_by_persist(prompt, rr.digests, stored):
            return False
        now = self.clock.now_s()
        if rr.persist_wait_since_s is None:
            rr.persist_wait_since_s = now
            self._loop.call_later(self.cfg.persist_wait_s, self._kick)
        return now - rr.persist_wait_since_s < self.cfg.persist_wait_s

    # --- 4. engine messages -------------------------------------------------------------------------
    def _on_message(self, msg: Any) -> None:
        if isinstance(msg, Hello):
            e = EngineState(msg.engine, EngineRole(msg.role), msg.endpoint, kv_capacity_tokens=msg.kv_capacity_tokens,
                            prefill_tokens_per_s=msg.prefill_tokens_per_s, outbox=Outbox(msg.endpoint))
            self.engines[msg.engine] = e
            return
        if isinstance(msg, Counters):
            self.metrics.counters(msg)
            return
        if isinstance(msg, Reconfigured):
            self._reconfigured.add(msg.engine)
            return
        if isinstance(msg, PersistQueued):
            self.placement.persist_queued(msg.digests)
            return
        if isinstance(msg, Persisted):
            self.placement.persisted(msg.digest)
            self._kick()
            return
        rr = self.requests.get(msg.rid)
        if rr is None:
            return
        if isinstance(msg, FirstToken):
            rr.advance(Phase.KV_TO_DECODE)  # the prompt's last chunk is computed
            self._first_token(rr, msg)
        elif isinstance(msg, Token):
            self._token(rr, msg)
        elif isinstance(msg, ReadDone):
            rr.advance(Phase.PREFILL_READY)
            self._read_ended(rr)
            self.metrics.read_done(rr.rid, msg.engine == rr.pe.engine, msg.nbytes)
        elif isinstance(msg, PrefillDone):
            self._pe_release(rr)
            self.placement.free(rr.pe.engine, rr.pe_regions)
            rr.pe_regions = []
            rr.pe_done = True
        elif isinstance(msg, PromptLoaded):
            self.placement.free(rr.de.engine, rr.de_regions)
            rr.de_regions = []
            rr.advance(Phase.DECODING)
            if rr.final_first_token is not None:
                self._first_token(rr, rr.final_first_token)
        elif isinstance(msg, DecodeDone):
            if rr.de_regions:  # never loaded (cancelled early)
                self.placement.free(rr.de.engine, rr.de_regions)
                rr.de_regions = []
            self._de_release(rr)
            rr.advance(Phase.FINISHED)
            rr.de_done = True
        if rr.pe_done and rr.de_done:
            self._read_ended(rr)  # a read cancelled before it ran never reports
            self.requests.pop(rr.rid, None)
            if not rr.finished:  # ended without a final token (e.g. cancelled in flight)
                rr.finished = True
        self._kick()

    def _read_ended(self, rr: RouterRequest) -> None:
        rr.side_engine.read_queue_tokens -= rr.read_charged_tokens
        rr.read_charged_tokens = 0

    def _pe_release(self, rr: RouterRequest) -> None:
        rr.pe.num_seqs -= 1
        rr.pe.num_tokens -= rr.qview.num_tokens
        self.scheduler.pe_released(rr.pe.engine, rr.pe.num_tokens)

    def _de_release(self, rr: RouterRequest) -> None:
        rr.de.num_seqs -= 1
        rr.de.num_tokens -= rr.total_tokens
        rr.de.kv_reserved_tokens -= rr.total_tokens
        self.scheduler.de_released(rr.de.engine, rr.de.num_tokens)

    def _emit(self, rr: RouterRequest, token: int, index: int, finished: bool, reason: str | None) -> None:
        if rr.finished:
            return
        rr.generated = index + 1
        now = self.clock.now_s()
        self.metrics.token(rr.rid, index, now)
        if finished:
            rr.finished = True
            self.metrics.finished(rr.rid)
        rr.queue.put_nowait(TokenEvent(token, index, finished, reason if finished else None,
                                       len(rr.req.prompt_ids), rr.hit_tokens))

    def _first_token(self, rr: RouterRequest, m: FirstToken) -> None:
        rr.hit_tokens = m.cached_tokens
        p = rr.req.params
        eos_ends = m.token in self.eos_token_ids and not p.ignore_eos and p.min_tokens <= 1
        done = p.max_tokens == 1 or eos_ends
        if done and not rr.prompt_loaded:  # the answer ends here: once the DE has announced its persists
            rr.final_first_token = m
            return
        self._emit(rr, m.token, 0, done, "length" if p.max_tokens == 1 else "stop")

    def _token(self, rr: RouterRequest, m: Token) -> None:
        self._emit(rr, m.token, m.index, m.finished, m.reason or None)

    # --- status -----------------------------------------------------------------------------------
    def health(self) -> dict:
        return {"engines": len(self.engines), "expected_engines": self._expected_engines,
                "requests": len(self.requests), "mode": self.cfg.mode}

    def metric_families(self) -> list[Family]:
        s = self.scheduler
        return self.metrics.families(QueueGauges(
            len(self.unscheduled) + (s.num_pe_queued if s else 0), s.num_de_queued if s else 0, len(self.placing),
            tuple((e.engine, e.role, e.read_queue_tokens) for e in self.engines.values()), self.cfg.snic_bytes_per_s))

    def check_invariants(self) -> None:
        """Loads and read queues equal the sums over live requests; reservations never exceed
        capacity; the scheduler's own ledgers match the engines."""
        check_ledgers(self.engines, self.requests.values())
        self.placement.check_invariants()
        if self.scheduler is not None:
            self.scheduler.check_invariants(self.view)

