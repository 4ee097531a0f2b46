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
An engine that dies or freezes is fenced (membership.py) and its requests migrate or fail (recovery.py).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import replace
from typing import Any, AsyncIterator

from ...config import RuntimeConfig
from ...core.blocks import salted_root
from ...core.phase import Phase
from ...core.request import RequestId
from ...core.scheduler import ClusterView, GlobalScheduler, SchedulePass
from ...core.snapshot import QueuedRequest, ReadSide
from ...errors import InputError
from ...metrics.prometheus import Family
from ..api import GenerationRequest, ServiceUnavailable, TokenEvent
from ..protocol import (Cancel, Counters, DecodeAssign, DramChanged, EngineRole, DecodeDone, FirstToken, Heartbeat,
                        Hello, Join, Leaving, PersistQueued, Persisted, PrefillAssign, PrefillDone, PromptLoaded, ReadDone,
                        Reconfigure, Reconfigured, RelayAssign, RelayDone, Token)
from ..transport.channel import Inbox, SendsTogether
from ..store.remote import read_token
from ..transport.shm import SlotLedger
from .bookings import Bookings
from .membership import Membership
from .metrics import QueueGauges, RouterMetrics
from .dram_index import DramIndex
from .placement import Placement
from .recovery import Recovery
from .state import EngineState, RouterRequest, RouterView, Stream, build_scheduler, check_ledgers, kv_reservation_tokens
from .tokens import emit, first_token, prompt_loaded

# a request's message that carries no engine field: which of its engines sent it (Router._from_fenced)
_SENDER = {FirstToken: EngineRole.PREFILL, Token: EngineRole.DECODE, PromptLoaded: EngineRole.DECODE}


class Router:
    def __init__(self, config: RuntimeConfig, *, model_name: str, tokenizer: Any, max_context_tokens: int,
                 eos_token_ids: tuple[int, ...], kv_bytes_per_token: int, full_block_bytes: int,
                 store: Any, endpoint: str, clock: Any, vocab_size: int | None = None) -> None:
        self.cfg = config
        self.features = config.features
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.max_context_tokens = max_context_tokens
        self.vocab_size = vocab_size  # a prompt's token ids must lie below it; None: not checked (stand-in models)
        self.eos_token_ids = eos_token_ids
        self.kv_bytes_per_token = kv_bytes_per_token
        self.full_block_bytes = full_block_bytes
        self.clock = clock
        self.token = None if config.transport.peer_token_file is None else read_token(config.transport.peer_token_file)
        self.membership = Membership(config, clock, self.token, full_block_bytes)
        self.engines: dict[int, EngineState] = self.membership.engines  # by id, as each engine said hello
        self.buffers: dict[int, SlotLedger] = self.membership.buffers  # node -> its host buffer's slots
        self.liveness = self.membership.liveness
        self.placement = Placement(store, self.buffers, config.block_tokens)
        self.placement.dram = self._dram_index()
        self.requests: dict[int, RouterRequest] = {}
        self.view: ClusterView = RouterView(self.engines, self.placement, kv_bytes_per_token,
                                            lambda node: self.metrics.store_latency_s(node))
        self.scheduler: GlobalScheduler | None = None  # built when every engine has said hello
        self.unscheduled: deque[RouterRequest] = deque()  # arrived before the scheduler existed
        self.placing: deque[RouterRequest] = deque()  # both engines chosen, waiting for buffer room
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pass_pending = False
        self.sends = SendsTogether()  # a placement loop's assignments leave together per engine
        self.metrics = RouterMetrics(clock, lambda: self.store)
        self.inbox = Inbox(endpoint, token=self.token)
        self.endpoint = self.inbox.endpoint  # tcp://HOST:0 binds a free port: the one it got
        self._stop = threading.Event()
        self._receiver = threading.Thread(target=self._receive, name="router-inbox", daemon=True)
        self.reconfigured: set[int] = set()
        self.bookings = Bookings(self.liveness, lambda: self.scheduler)
        self.recovery = Recovery(self, self.membership, self.bookings, self.placement, config)
        self.membership.requests = self.recovery
        self._engine_messages = {Leaving: self._leaving, Counters: self._counters, Reconfigured: self._reconfigured,
                                 PersistQueued: self._persist_queued, Persisted: self._persisted,
                                 DramChanged: self._dram_changed}
        self._request_messages = {FirstToken: self._first_token, Token: self._token, ReadDone: self._read_done,
                                  PrefillDone: self._prefill_done, PromptLoaded: self._prompt_loaded,
                                  DecodeDone: self._decode_done, RelayDone: self._relay_done}

    @property
    def store(self) -> Any:
        return self.placement.store

    # --- life cycle ------------------------------------------------------------------------------
    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._receiver.start()

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = self.clock.now_s() + timeout_s
        while len(self.engines) < self.membership.expected_engines or self.liveness.down:
            if self.liveness.down:
                raise RuntimeError(f"engine(s) died during start-up: {self.liveness.down}")
            if self.clock.now_s() > deadline:
                raise RuntimeError(f"only {len(self.engines)} of {self.membership.expected_engines} engines came up")
            await asyncio.sleep(0.05)
        self.new_scheduler()
        self.membership.check_heartbeats()

    def stop(self) -> None:
        self._stop.set()
        if self.membership.watch is not None:
            self.membership.watch.cancel()
        self._receiver.join(timeout=5)
        for box in (e.outbox for e in self.engines.values() if e.outbox is not None):
            box.close()
        self.inbox.close()

    def _receive(self) -> None:
        while not self._stop.is_set():
            msg = self.inbox.recv(0.05)
            if isinstance(msg, (Heartbeat, Hello)):  # stamped here: a busy loop makes no engine late
                self.liveness.seen(msg.engine, self.clock.now_s())
            if msg is not None and self._loop is not None and not isinstance(msg, Heartbeat):
                self._loop.call_soon_threadsafe(self._on_message, msg)

    def new_scheduler(self, queued: list[RouterRequest] = ()) -> None:
        """alpha from the configured SNIC rate, beta from the slowest live PE's profiled rate
        (derive_thresholds); the mode's rules; the live engines as groups of one, with their loads;
        `queued` (requests no engine has heard of) joins the queue after those not yet scheduled."""
        self.scheduler, pes, des = build_scheduler(self.cfg, self.membership.live_engines(), self.kv_bytes_per_token)
        self.metrics.engine_index = self.metrics.engine_index or {e: i for ids in (pes, des) for i, e in enumerate(ids)}
        self.unscheduled.extend(queued)
        while self.unscheduled:
            rr = self.unscheduled.popleft()
            self.scheduler.submit(rr.qview, rr)
        self.kick()

    async def reconfigure(self, mode: str, store: Any, store_root: str, timeout_s: float = 120.0) -> None:
        """Switch a live, idle cluster to `mode` on a fresh store (`dualpath demo` runs basic then dualpath
        on the same engines): every engine drains its reads and writes, reopens its store and
        acknowledges; then the router's config, store, metrics and scheduler follow."""
        if self.requests:
            raise RuntimeError("reconfigure needs an idle cluster")
        self.reconfigured = set()
        for e in self.membership.live_engines():
            e.outbox.send(Reconfigure(mode, store_root))
        deadline = self.clock.now_s() + timeout_s
        while len(self.reconfigured) < len(self.membership.live_engines()):
            if self.clock.now_s() > deadline:
                raise RuntimeError("engines did not acknowledge the new mode")
            await asyncio.sleep(0.02)
        self.cfg = replace(self.cfg, mode=mode)
        self.features = self.cfg.features
        self.placement.store = store
        self.placement.dram = self._dram_index()  # the engines' tiers start empty too
        self.metrics = RouterMetrics(self.clock, lambda: self.store)
        self.new_scheduler()

    def _dram_index(self) -> DramIndex | None:
        """The mode's model of the nodes' DRAM tiers (`+dram`), chosen once per mode."""
        if not self.features.dram_tier:
            return None
        return DramIndex(int(self.cfg.store.dram_tier_mb * 2**20), self.full_block_bytes, self.cfg.block_tokens)

    # --- 1. requests ------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        rr = self.admit(request)
        try:
            while True:
                ev: TokenEvent | ServiceUnavailable = await rr.queue.get()
                if isinstance(ev, ServiceUnavailable):
                    raise ev  # its engine died and no other can continue it (recovery.py)
                yield ev
                if ev.finished and rr.current.stream is Stream.FINISHED and rr.queue.empty():  # every choice's last
                    return
        finally:
            if not rr.current.finished:
                self._cancel(rr.current)

    def admit(self, request: GenerationRequest) -> RouterRequest:
        """Check the request and queue it for the next pass (InputError names what is wrong;
        ServiceUnavailable when a role has no live engine)."""
        n = len(request.prompt_ids)
        if n == 0:
            raise InputError("prompt is empty")
        ids = request.prompt_ids
        if self.vocab_size is not None and (min(ids) < 0 or max(ids) >= self.vocab_size):  # an engine would fail on it
            bad = next(t for t in ids if not 0 <= t < self.vocab_size)
            raise InputError(f"prompt: token id {bad} is outside the model's vocabulary [0, {self.vocab_size})")
        if n + request.params.max_tokens > self.max_context_tokens:
            raise InputError(f"prompt ({n} tokens) + max_tokens ({request.params.max_tokens}) exceeds the context window "
                             f"({self.max_context_tokens} tokens)")
        if kv_reservation_tokens(n, request.params.max_tokens, request.params.n, self.cfg.block_tokens) > self.cfg.engines.de_kv_tokens:
            raise InputError(f"prompt + max_tokens (x n) exceeds a decode engine's KV cache ({self.cfg.engines.de_kv_tokens} tokens)")
        if self.liveness.down and not self.membership.servable() and not self.membership.restart_pending():
            raise ServiceUnavailable(f"no engine can serve it: {self.membership.describe_down()}")
        rr = self.new_record(request, asyncio.Queue())
        self.metrics.arrived(rr.rid)
        if self.scheduler is None or not self.membership.servable():  # before start-up's end, or waiting for a successor
            self.unscheduled.append(rr)
        else:
            self.scheduler.submit(rr.qview, rr)
        self.kick()
        return rr

    def new_record(self, request: GenerationRequest, queue: asyncio.Queue) -> RouterRequest:
        """A request's record under a fresh id, in `requests` (not yet queued for a pass)."""
        rid, bt, n = next(self._ids), self.cfg.block_tokens, len(request.prompt_ids)
        total = kv_reservation_tokens(n, request.params.max_tokens, request.params.n, bt)
        digests = self.placement.digests(request.prompt_ids, request.cache_salt)
        # +selective decides on the uncached tokens the store's index gives now (core/policy/local.py)
        uncached = n - self.placement.lookup(request.prompt_ids, digests) if self.features.local_prefill else None
        qview = QueuedRequest(RequestId(rid, 0), n, total * self.kv_bytes_per_token, total, uncached)
        rr = self.requests[rid] = RouterRequest(rid, request, queue, self.clock.now_s(), total, qview, digests=digests)
        return rr

    def _cancel(self, rr: RouterRequest) -> None:
        rr.end(Stream.CANCELLED)
        self.metrics.cancelled(rr.stream_rid)
        if rr in self.unscheduled:
            self.unscheduled.remove(rr)
        if not rr.placed:  # no engine has heard of it: undo what the pass booked
            self.recovery.unbook(rr)
            self.requests.pop(rr.rid, None)
        for e in (rr.pe_side, rr.de):  # (none left unless placed)
            if e is not None and e.outbox is not None and self.liveness.is_alive(e.engine):
                e.outbox.send(Cancel(rr.rid))
        self.kick()

    # --- 2. scheduling ------------------------------------------------------------------------------
    def kick(self) -> None:
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
            self.bookings.assigned_pe(a.ref, self.engines[a.engine])
            self.metrics.pe_assigned(a.ref.rid)
        for d in p.decode:
            rr: RouterRequest = d.ref
            if d.local:  # its DE prefills it: no PE computes it (PE_ASSIGNED: chosen, not placed)
                rr.local = True
                rr.relay = self.engines[d.relay_node] if d.relay_node >= 0 else None  # a PE node reads its hit
                rr.pe_done = rr.relay is None
                rr.advance(Phase.PE_ASSIGNED)
            self.bookings.assigned_de(rr, self.engines[d.engine], d.side, d.read_tokens, d.recompute, d.pe_part_tokens)
            self.placing.append(rr)
            self.metrics.de_assigned(rr, int(d.side), d.read_tokens, d.recompute, d.pe_part_tokens,
                                     (d.pe_cost_tokens, d.de_cost_tokens))

    # --- 3. placement and assignment ----------------------------------------------------------------
    def _place(self) -> None:
        """Place the FIFO's heads; their assignments leave together per engine at the end
        (`SendsTogether`), so an idle PE batches every request this pass placed on it, as the
        simulator's PE sees them (not whichever reached it before it woke)."""
        with self.sends.together():
            while self.placing:
                rr = self.placing[0]
                if not self._try_place(rr):
                    return  # FIFO: wait for buffer room
                self.placing.popleft()

    def _try_place(self, rr: RouterRequest) -> bool:
        prompt = list(rr.req.prompt_ids)
        stored = 0 if rr.recompute else self.placement.store.lookup(rr.digests)  # a persist may have landed since
        wait_s = self.cfg.store.persist_wait_s
        if not rr.recompute and self.placement.wait_for_persist(rr, prompt, stored, self.clock.now_s(), wait_s,
                                                                lambda: self._loop.call_later(wait_s, self.kick)):
            return False
        hit = self.placement.hit_tokens(prompt, stored)
        pe_side = rr.pe_side  # a local request's relay holds its hit's room, as a split's PE its part's
        side, pe_part = (ReadSide.DECODE, hit if rr.relay else 0) if rr.local else (rr.side, min(rr.pe_part_tokens, hit))
        regions = self.placement.allocate_regions(-1 if pe_side is None else pe_side.engine, rr.de.engine, len(prompt), side,
                                                  pe_part)
        if regions is None:
            return False
        rr.de_regions, rr.pe_regions = regions
        self.bookings.hit_found(rr, hit)
        rr.hit_tokens = hit
        rr.advance(Phase.READING if hit else Phase.PREFILL_READY)
        self._send_assignments(rr, prompt)
        self.metrics.placed(rr.stream_rid, hit, rr.side)
        return True

    def _send_assignments(self, rr: RouterRequest, prompt: list[int]) -> None:
        p, hit, side = rr.req.params, rr.hit_tokens, int(rr.side)
        seed = p.seed if p.seed is not None else rr.rid
        hit_digests = rr.digests[: hit // self.cfg.block_tokens]
        de_offsets = [r.offset_bytes for r in rr.de_regions]
        pe_side = rr.pe_side
        pe_endpoint = "" if pe_side is None else pe_side.endpoint
        self.sends.send(rr.de.outbox, DecodeAssign(rr.rid, prompt, hit, hit_digests, side, pe_endpoint, de_offsets,
                                       salted_root(rr.req.cache_salt), p.max_tokens, p.min_tokens, p.ignore_eos,
                                       p.temperature, p.top_p, seed, p.logprobs, p.n, rr.pe_part_tokens, rr.local))
        if rr.local:
            if rr.relay is not None and hit:
                self.sends.send(rr.relay.outbox, RelayAssign(rr.rid, hit_digests, [r.offset_bytes for r in rr.pe_regions],
                                                             rr.de.engine, rr.de.endpoint, self.buffers[rr.de.engine].name,
                                                             rr.de.data_endpoint, de_offsets))
            elif rr.relay is not None:  # nothing to relay after all: the relay is done
                rr.pe_done = True
            return
        self.sends.send(rr.pe.outbox, PrefillAssign(rr.rid, prompt, hit, hit_digests, side, rr.de.engine, rr.de.endpoint,
                                        self.buffers[rr.de.engine].name, rr.de.data_endpoint, de_offsets,
                                        [r.offset_bytes for r in rr.pe_regions], p.temperature, p.top_p, seed,
                                        p.min_tokens > 0 or p.ignore_eos, self.features.layerwise_prefill, p.logprobs,
                                        p.n, rr.pe_part_tokens))

    # --- 4. engine messages -------------------------------------------------------------------------
    def _on_message(self, msg: Any) -> None:
        """An engine's message by its type: a Join or Hello first (from engines not yet live), then,
        from a live engine, its own news or a request's (`_request_messages`), on the loop."""
        kind = type(msg)
        if kind is Join:  # an engine started on its own: the cluster answers (runtime/cluster.py)
            return self.membership.on_join(msg)
        if kind is Hello:  # a new engine, or a fenced one's successor (membership.py)
            return self.membership.on_hello(msg)
        if not self.liveness.is_alive(getattr(msg, "engine", -1)):
            return  # a fenced engine (liveness.py): it was killed; a late message counts for nothing
        if kind in self._engine_messages:
            return self._engine_messages[kind](msg)
        rr = self.requests.get(msg.rid)
        if rr is None or self._from_fenced(rr, msg):
            return
        handler = self._request_messages.get(kind)
        if handler is not None:
            handler(rr, msg)
        if rr.pe_done and rr.de_done:
            self.bookings.read_ended(rr)  # a read cancelled before it ran never reports
            self.requests.pop(rr.rid, None)
            if not rr.finished:
                rr.end(Stream.FINISHED)  # without a final token (a request cut off in flight)
        self.kick()

    # an engine's own news (no request); methods, not the collaborators' bound ones: a mode switch
    # builds new RouterMetrics (reconfigure)
    def _leaving(self, msg: Leaving) -> None:
        self.membership.on_leaving(msg)

    def _counters(self, msg: Counters) -> None:
        self.metrics.counters(msg)

    def _reconfigured(self, msg: Reconfigured) -> None:
        self.reconfigured.add(msg.engine)

    def _persist_queued(self, msg: PersistQueued) -> None:
        self.placement.persist_queued(msg.digests, msg.engine)
        if self.placement.dram is not None:  # in the DE's tier from its copy out of HBM, just after this
            self.placement.dram.persist_queued(msg.engine, msg.digests)

    def _dram_changed(self, msg: DramChanged) -> None:
        if self.placement.dram is not None:  # (a report of the mode before a switch finds none)
            self.placement.dram.changed(msg.engine, msg.held, msg.dropped)

    def _persisted(self, msg: Persisted) -> None:
        self.placement.persisted(msg.digest, msg.engine)
        self.metrics.persisted(msg.stored)
        self.kick()

    # a request's progress (protocol.py's numbered path)
    def _first_token(self, rr: RouterRequest, msg: FirstToken) -> None:
        rr.advance(Phase.KV_TO_DECODE)  # the prompt's last chunk is computed
        first_token(rr, msg, self.eos_token_ids, self.metrics, self.clock.now_s())

    def _token(self, rr: RouterRequest, msg: Token) -> None:
        emit(rr, self.metrics, self.clock.now_s(), msg.token, msg.index, msg.finished, msg.reason or None, msg.logprobs, msg.choice)

    def _read_done(self, rr: RouterRequest, msg: ReadDone) -> None:
        self.bookings.read_ended(rr, msg.engine)
        rr.advance(Phase.READING if self.bookings.reading(rr) else Phase.PREFILL_READY)  # a split: once both parts are in
        pe_side = rr.pe_side
        self.metrics.read_done(rr.rid, pe_side is not None and msg.engine == pe_side.engine, msg.nbytes)

    def _prefill_done(self, rr: RouterRequest, msg: PrefillDone) -> None:
        self.bookings.pe_released(rr)
        self.placement.free(rr.pe.engine, rr.pe_regions)
        rr.pe_regions = []
        rr.pe_done = True
        self.placement.release_de_regions(rr)

    def _relay_done(self, rr: RouterRequest, msg: RelayDone) -> None:
        """A relay's bytes are in the DE's region (+selective): its own slots free, its part done."""
        assert rr.relay is not None
        self.placement.free(rr.relay.engine, rr.pe_regions)
        rr.pe_regions = []
        rr.pe_done = True
        self.placement.release_de_regions(rr)

    def _prompt_loaded(self, rr: RouterRequest, msg: PromptLoaded) -> None:
        self.placement.free(rr.de.engine, rr.de_regions)
        rr.de_regions = []
        rr.advance(Phase.DECODING)
        prompt_loaded(rr, msg, self.eos_token_ids, self.metrics, self.clock.now_s())

    def _decode_done(self, rr: RouterRequest, msg: DecodeDone) -> None:
        self.bookings.de_released(rr)
        rr.advance(Phase.FINISHED)
        rr.de_done = True
        self.placement.release_de_regions(rr)  # never loaded (cancelled early)

    def _from_fenced(self, rr: RouterRequest, msg: Any) -> bool:
        """A request's message without an engine field, from an engine fenced since it was sent."""
        role = _SENDER.get(type(msg))
        sender = None if role is None else rr.pe if role is EngineRole.PREFILL and not rr.local else rr.de
        return sender is not None and not self.liveness.is_alive(sender.engine)

    # --- status -----------------------------------------------------------------------------------
    def health(self) -> dict:
        """status ok | degraded (an engine is down, every role still served) | unavailable."""
        return {**self.membership.health(), "expected_engines": self.membership.expected_engines,
                "requests": len(self.requests), "mode": self.cfg.mode}

    def metric_families(self) -> list[Family]:
        s = self.scheduler
        return self.metrics.families(QueueGauges(
            len(self.unscheduled) + (s.num_pe_queued if s else 0), s.num_de_queued if s else 0, len(self.placing),
            tuple((e.engine, e.role, e.read_queue_tokens) for e in self.engines.values()), self.cfg.links.snic_bytes_per_s))

    def check_invariants(self) -> None:
        """Loads and read queues equal the sums over live requests; reservations never exceed
        capacity; the scheduler's own ledgers match the engines (while it serves: with a role
        left empty it is frozen, recovery.py)."""
        check_ledgers(self.engines, self.requests.values())
        self.placement.check_invariants()
        if self.scheduler is not None and self.membership.servable():
            self.scheduler.check_invariants(self.view)

