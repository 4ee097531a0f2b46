"""The router: runs the shared core policy over the live cluster and streams tokens back.

It owns the truth the policy needs (engine loads, node read queues, HBM reservations, host-buffer
slots) and changes it only on its event loop. Engines report through ZeroMQ; a receiver thread
hands each message to the loop.

Numbered path of one request through the router (the engines' side is in protocol.py):
  1. `generate`: tokens in, an id out; the request joins the global FIFO queue.
  2. A scheduling pass (coalesced, after any change): PE by Algorithm 1 (DualPath) or round robin,
     DE in two phases with HBM fit, then the hit (longest stored prefix of chained block digests),
     the read side (shorter node read queue), and host-buffer regions (DE region always; PE region
     on the PE path). A request that finds no buffer room waits for the next pass.
  3. `DecodeAssign` to the DE, `PrefillAssign` to the PE; loads and read queues grow.
  4. `FirstToken` / `Token` become `TokenEvent`s on the request's queue; `ReadDone`, `PrefillDone`,
     `PromptLoaded`, `DecodeDone` shrink read queues, PE loads, regions and HBM reservations.
  5. A consumer that stops iterating cancels the request on every engine it touched.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

from ...config import RuntimeConfig
from ...core.blocks import chain_digests
from ...core.policy import (PrefillThresholds, RoundRobinCursor, choose_read_side, distribute_to_groups,
                           round_robin_decode, round_robin_prefill, round_robin_read_side, select_decode,
                           select_prefill)
from ...core.request import RequestId, usable_hit_tokens
from ...core.snapshot import EngineLoad, GroupLoad, QueuedRequest, ReadSide
from ...errors import InputError
from ..api import GenerationRequest, TokenEvent
from .metrics import QueueGauges, RouterMetrics
from ..protocol import (Cancel, Counters, Reconfigure, Reconfigured, DecodeAssign, DecodeDone, FirstToken, Hello, PersistQueued,
                       Persisted, PrefillAssign, PrefillDone, PromptLoaded, ReadDone, Token)
from ..transport.channel import Inbox, Outbox
from ..transport.shm import BufferFull, HostBuffer, ShmRegion


@dataclass(slots=True)
class EngineState:
    engine: int
    role: str
    endpoint: str
    kv_capacity_tokens: int = 0
    kv_reserved_tokens: int = 0
    num_seqs: int = 0
    num_tokens: int = 0
    read_queue_tokens: int = 0
    prefill_tokens_per_s: float = 0.0
    outbox: Outbox | None = None


@dataclass(slots=True)
class RouterRequest:
    rid: int
    req: GenerationRequest
    queue: asyncio.Queue
    arrival_s: float
    pe: EngineState | None = None
    de: EngineState | None = None
    hit_tokens: int = 0
    side: ReadSide = ReadSide.PREFILL
    de_regions: list = field(default_factory=list)
    pe_regions: list = field(default_factory=list)
    first_s: float = -1.0
    last_s: float = -1.0
    generated: int = 0
    finished: bool = False
    placed: bool = False  # assignments sent to both engines
    pe_done: bool = False
    de_done: bool = False
    qview: QueuedRequest | None = None
    prompt_loaded: bool = False  # the DE has the prompt (and has announced its prompt blocks' persists)
    final_first_token: FirstToken | None = None  # a 1-token answer, held until prompt_loaded
    persist_wait_since_s: float | None = None  # placement waits for a block still being written

    total_tokens: int = 0  # prompt + max_tokens, rounded up to whole KV-cache blocks (DE HBM)


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
        self.store = store
        self.clock = clock
        self.engines: dict[int, EngineState] = {}
        self.requests: dict[int, RouterRequest] = {}
        self.pe_queue: deque[RouterRequest] = deque()
        self.de_queue: deque[RouterRequest] = deque()
        self.private: dict[int, deque[RouterRequest]] = {}
        self.placing: deque[RouterRequest] = deque()  # both engines chosen, waiting for buffer room
        self.thresholds: PrefillThresholds | None = None
        self._rr = {"pe": RoundRobinCursor(), "de": RoundRobinCursor(), "side": RoundRobinCursor()}
        self._ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pass_pending = False
        self.metrics = RouterMetrics(clock)
        self.inbox = Inbox(endpoint)
        self.endpoint = endpoint
        self._stop = threading.Event()
        self._hello = threading.Event()
        self._receiver = threading.Thread(target=self._receive, name="router-inbox", daemon=True)
        self._expected_engines = config.num_prefill + config.num_decode
        self._reconfigured: set[int] = set()
        self.persisting: dict[bytes, int] = {}  # digest -> writes queued on a DE and not yet ended

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
        self._set_thresholds()

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

    def _set_thresholds(self) -> None:
        """alpha: tokens a node reads in 3 s; beta: prompt tokens a PE processes in 5 s (profiled
        by each PE at start) (PAPER.md 3.2)."""
        snic = self.cfg.snic_bytes_per_s if not self.features.io_free else None
        alpha = int(self.cfg.alpha_read_s * snic / self.kv_bytes_per_token) if snic else 2**62
        pes = [e for e in self.engines.values() if e.role == "prefill"]
        rate = min(e.prefill_tokens_per_s for e in pes) if pes else 1.0
        self.thresholds = PrefillThresholds(alpha, max(1, int(self.cfg.beta_compute_s * rate)))

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
        self.store = store
        self.metrics = RouterMetrics(self.clock)
        self._set_thresholds()

    # --- 1. requests ------------------------------------------------------------------------------
    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        n = len(request.prompt_ids)
        if n == 0:
            raise InputError("prompt is empty")
        if n + request.params.max_tokens > self.max_context_tokens:
            raise InputError(f"prompt ({n} tokens) + max_tokens ({request.params.max_tokens}) exceeds the context window "
                             f"({self.max_context_tokens} tokens)")
        if n + request.params.max_tokens > self.cfg.de_kv_tokens:
            raise InputError(f"prompt + max_tokens exceeds a decode engine's KV cache ({self.cfg.de_kv_tokens} tokens)")
        rid = next(self._ids)
        rr = RouterRequest(rid, request, asyncio.Queue(), self.clock.now_s())
        bt = self.cfg.block_tokens
        rr.total_tokens = -(-(n + request.params.max_tokens) // bt) * bt
        hbm = rr.total_tokens * self.kv_bytes_per_token
        rr.qview = QueuedRequest(RequestId(rid, 0), n, hbm, 0)
        self.requests[rid] = rr
        self.pe_queue.append(rr)
        self.metrics.arrived(rid)
        self._kick()
        try:
            while True:
                ev: TokenEvent = await rr.queue.get()
                yield ev
                if ev.finished:
                    return
        finally:
            if not rr.finished:
                self._cancel(rr)

    def _cancel(self, rr: RouterRequest) -> None:
        rr.finished = True
        self.metrics.cancelled(rr.rid)
        for q in (self.pe_queue, self.de_queue, self.placing, *self.private.values()):
            if rr in q:
                q.remove(rr)
        for e in (rr.pe, rr.de):
            if e is not None and e.outbox is not None:
                e.outbox.send(Cancel(rr.rid))
        if rr.pe is None:
            self.requests.pop(rr.rid, None)
        elif rr.de is None:  # PE chosen, DE not: only the PE's load to undo
            self._pe_release(rr)
            self.requests.pop(rr.rid, None)
        elif not rr.placed:  # both chosen, never placed: nothing was sent
            self._pe_release(rr)
            self._de_release(rr)
            self.requests.pop(rr.rid, None)
        self._kick()

    # --- 2. scheduling ------------------------------------------------------------------------------
    def _kick(self) -> None:
        if not self._pass_pending and self._loop is not None:
            self._pass_pending = True
            self._loop.call_soon(self._pass)

    def _pass(self) -> None:
        self._pass_pending = False
        if self.thresholds is None:
            return
        if self.pe_queue:
            self._fetch_prefill()
        if self.de_queue or any(self.private.values()):
            self._fetch_decode()
        self._place()

    def _pes(self) -> list[EngineState]:
        return sorted((e for e in self.engines.values() if e.role == "prefill"), key=lambda e: e.engine)

    def _des(self) -> list[EngineState]:
        return sorted((e for e in self.engines.values() if e.role == "decode"), key=lambda e: e.engine)

    def _load(self, e: EngineState) -> EngineLoad:
        free = (e.kv_capacity_tokens - e.kv_reserved_tokens) * self.kv_bytes_per_token
        return EngineLoad(e.engine, e.engine, e.num_seqs, e.num_tokens, max(0, free))

    def _fetch_prefill(self) -> None:
        read_q = {e.engine: e.read_queue_tokens for e in self.engines.values()}
        for pe in self._pes():  # one engine per group (node) on this runtime
            if not self.pe_queue:
                return
            views = (r.qview for r in self.pe_queue)
            if self.features.dualpath_scheduler:
                out = select_prefill([self._load(pe)], read_q, views, self.thresholds)
            else:
                out, self._rr["pe"] = round_robin_prefill([self._load(pe)], views, self.thresholds.beta_tokens, self._rr["pe"])
            for a in out:
                rr = self.pe_queue.popleft()
                assert rr.rid == a.rid.agent
                rr.pe = pe
                pe.num_seqs += 1
                pe.num_tokens += rr.qview.num_tokens
                self.de_queue.append(rr)
                self.metrics.pe_assigned(rr.rid)

    def _fetch_decode(self) -> None:
        des = self._des()
        if self.features.dualpath_scheduler:
            if self.de_queue:
                placed = distribute_to_groups({d.engine: d.num_tokens for d in des}, (r.qview for r in self.de_queue))
                for ga in placed:
                    rr = self.de_queue.popleft()
                    self.private.setdefault(ga.group, deque()).append(rr)
            for d in des:
                q = self.private.get(d.engine)
                if not q:
                    continue
                out = select_decode(GroupLoad(d.engine, (self._load(d),)), [r.qview for r in q], self.cfg.z_factor)
                for a in out:
                    self._assign_de(q.popleft(), d)
        else:
            out, self._rr["de"] = round_robin_decode([self._load(d) for d in des], (r.qview for r in self.de_queue), self._rr["de"])
            for a in out:
                self._assign_de(self.de_queue.popleft(), self.engines[a.engine])

    def _assign_de(self, rr: RouterRequest, de: EngineState) -> None:
        rr.de = de
        de.num_seqs += 1
        de.num_tokens += rr.total_tokens
        de.kv_reserved_tokens += rr.total_tokens
        self.placing.append(rr)
        self.metrics.de_assigned(rr.rid)

    # --- 3. hit, read side, buffers, assignment ----------------------------------------------------
    def _place(self) -> None:
        while self.placing:
            rr = self.placing[0]
            if not self._try_place(rr):
                return  # FIFO: wait for buffer room
            self.placing.popleft()

    def _try_place(self, rr: RouterRequest) -> bool:
        prompt = list(rr.req.prompt_ids)
        bt = self.cfg.block_tokens
        digests = chain_digests(prompt, bt)
        stored = self.store.lookup(digests)
        if self._wait_for_persist(rr, digests, stored):
            return False
        hit = usable_hit_tokens(stored * bt, len(prompt), bt)
        pe_node, de_node = rr.pe.engine, rr.de.engine
        if self.cfg.force_read_side is not None:
            side = ReadSide.DECODE if self.cfg.force_read_side == "decode" else ReadSide.PREFILL
        elif not self.features.de_read_path:
            side = ReadSide.PREFILL
        elif self.features.dualpath_scheduler:
            side = choose_read_side(self.engines[pe_node].read_queue_tokens, self.engines[de_node].read_queue_tokens)
        else:
            side, self._rr["side"] = round_robin_read_side(self._rr["side"])
        nblocks = -(-len(prompt) // bt)
        try:
            de_regions = self._allocate(de_node, nblocks)
        except BufferFull:
            return False
        pe_regions: list = []
        if side is ReadSide.PREFILL:
            try:
                pe_regions = self._allocate(pe_node, nblocks)
            except BufferFull:
                self._free(de_node, de_regions)
                return False
        rr.hit_tokens, rr.side, rr.de_regions, rr.pe_regions = hit, side, de_regions, pe_regions
        rr.placed = True
        if hit:
            (rr.pe if side is ReadSide.PREFILL else rr.de).read_queue_tokens += hit
        p = rr.req.params
        hit_digests = digests[: hit // bt]
        de_offsets = [r.offset_bytes for r in de_regions]
        rr.de.outbox.send(DecodeAssign(rr.rid, prompt, hit, hit_digests, int(side), rr.pe.endpoint, de_offsets,
                                       p.max_tokens, p.min_tokens, p.ignore_eos, p.temperature, p.top_p,
                                       p.seed if p.seed is not None else rr.rid))
        rr.pe.outbox.send(PrefillAssign(rr.rid, prompt, hit, hit_digests, int(side), rr.de.engine, rr.de.endpoint,
                                        self.buffers[de_node].name, de_offsets, [r.offset_bytes for r in pe_regions],
                                        p.temperature, p.top_p, p.seed if p.seed is not None else rr.rid,
                                        p.min_tokens > 0 or p.ignore_eos, self.features.layerwise_prefill))
        self.metrics.placed(rr.rid, hit, side)
        return True

    def _wait_for_persist(self, rr: RouterRequest, digests: list[bytes], stored: int) -> bool:
        """True while the block after the stored prefix is still being written by a DE (PAPER.md
        A.4: a turn hits the client's whole earlier context). `Persisted` kicks the next pass; after
        `persist_wait_s` the request goes on with what is stored (a write that never reports)."""
        usable = (len(rr.req.prompt_ids) - 1) // self.cfg.block_tokens  # the hit leaves a token to compute
        if stored >= min(usable, len(digests)) or digests[stored] not in self.persisting:
            return False
        now = self.clock.now_s()
        if rr.persist_wait_since_s is None:
            rr.persist_wait_since_s = now
            self._loop.call_later(self.cfg.persist_wait_s, self._kick)
        return now - rr.persist_wait_since_s < self.cfg.persist_wait_s

    def _allocate(self, node: int, nblocks: int) -> list[ShmRegion]:
        buf = self.buffers[node]
        if buf.num_free_slots < nblocks:
            raise BufferFull(f"node {node}: {buf.num_free_slots} free slots, {nblocks} needed")
        return [buf.allocate() for _ in range(nblocks)]

    def _free(self, node: int, regions: list[ShmRegion]) -> None:
        for r in regions:
            self.buffers[node].free(r)

    # --- 4. engine messages -------------------------------------------------------------------------
    def _on_message(self, msg: Any) -> None:
        if isinstance(msg, Hello):
            e = EngineState(msg.engine, msg.role, msg.endpoint, kv_capacity_tokens=msg.kv_capacity_tokens,
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
            for d in msg.digests:
                self.persisting[d] = self.persisting.get(d, 0) + 1
            return
        if isinstance(msg, Persisted):
            left = self.persisting.pop(msg.digest, 0) - 1
            if left > 0:
                self.persisting[msg.digest] = left
            self._kick()
            return
        rr = self.requests.get(msg.rid)
        if rr is None:
            return
        if isinstance(msg, FirstToken):
            self._first_token(rr, msg)
        elif isinstance(msg, Token):
            self._token(rr, msg)
        elif isinstance(msg, ReadDone):
            self.engines[msg.engine].read_queue_tokens -= msg.tokens
            self.metrics.read_done(rr.rid, msg.engine == rr.pe.engine, msg.nbytes)
        elif isinstance(msg, PrefillDone):
            self._pe_release(rr)
            self._free(rr.pe.engine, rr.pe_regions)
            rr.pe_regions = []
            rr.pe_done = True
        elif isinstance(msg, PromptLoaded):
            self._free(rr.de.engine, rr.de_regions)
            rr.de_regions = []
            rr.prompt_loaded = True
            if rr.final_first_token is not None:
                self._first_token(rr, rr.final_first_token)
        elif isinstance(msg, DecodeDone):
            if rr.de_regions:  # never loaded (cancelled early)
                self._free(rr.de.engine, rr.de_regions)
                rr.de_regions = []
            self._de_release(rr)
            rr.de_done = True
        if rr.pe_done and rr.de_done:
            self.requests.pop(rr.rid, None)
            if not rr.finished:  # ended without a final token (e.g. cancelled in flight)
                rr.finished = True
        self._kick()

    def _pe_release(self, rr: RouterRequest) -> None:
        rr.pe.num_seqs -= 1
        rr.pe.num_tokens -= rr.qview.num_tokens

    def _de_release(self, rr: RouterRequest) -> None:
        rr.de.num_seqs -= 1
        rr.de.num_tokens -= rr.total_tokens
        rr.de.kv_reserved_tokens -= rr.total_tokens

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

    def metrics_text(self) -> str:
        return self.metrics.prometheus(QueueGauges(
            len(self.pe_queue), len(self.de_queue) + sum(len(q) for q in self.private.values()), len(self.placing),
            tuple((e.engine, e.role, e.read_queue_tokens) for e in self.engines.values()), self.cfg.snic_bytes_per_s))

    def check_invariants(self) -> None:
        """Loads equal the sum over live requests; reservations never exceed capacity."""
        tok = {e: 0 for e in self.engines}
        seq = dict(tok)
        kv = dict(tok)
        for rr in self.requests.values():
            if rr.pe is not None and not rr.pe_done:
                tok[rr.pe.engine] += rr.qview.num_tokens
                seq[rr.pe.engine] += 1
            if rr.de is not None and not rr.de_done:
                tok[rr.de.engine] += rr.total_tokens
                seq[rr.de.engine] += 1
                kv[rr.de.engine] += rr.total_tokens
        for e in self.engines.values():
            assert (e.num_tokens, e.num_seqs) == (tok[e.engine], seq[e.engine]), f"engine {e.engine} load ledger off"
            assert e.kv_reserved_tokens == kv[e.engine], f"engine {e.engine} HBM ledger off"
            if e.role == "decode":
                assert e.kv_reserved_tokens <= e.kv_capacity_tokens, f"engine {e.engine} HBM overcommitted"
            assert e.read_queue_tokens >= 0
        for buf in self.buffers.values():
            buf.check_invariants()

