"""Prefill engine process: layerwise prefill with compute-quota batching and chunked prefill.

Numbered path of one request through a PE (protocol.py has the whole picture):
  1. `PrefillAssign`: PE path with a hit -> read the hit blocks into this node's buffer (the
     reader thread paces them through the node's emulated SNIC); DE path -> wait for `HitReady`;
     a split read (`dualpath+split`) -> both: its PE part (the hit's prefix) read here, the rest
     by the DE, ready once both are in (prefill_request.py: `part_loaded`).
     A block that fails its checksum ends the hit there; the rest is recomputed.
  2. Ready requests join the batch queue (FIFO). When idle, the engine forms a batch with
     `core.policy.form_prefill_batch` (DualPath: the attention work of the paper's 300 ms quota,
     see RuntimeConfig; basic: a token budget), chunking the last request; the cached KV of the
     batch must fit the landing zone.
  3. (`kv_stream.PrefillKvStream`) Per layer l: the cached KV of every item lands in the landing zone ("HBM") - PE path: copied
     from this node's buffer by this engine's CNIC arbiter; DE path: pulled from the DE, whose
     arbiter writes it here; a split read: its PE part copied, the rest pulled - while layer l-1 computes (layerwise; otherwise all layers load first).
     Layer l's new KV goes to the DE's buffer (PE path: the hit as well), through the arbiter.
     Every load and PD copy carries a checksum per block piece (transport/integrity.py): a load that
     fails is loaded again, then (out of tries) the request restarts and recomputes its prompt.
  4. After the last layer, the first token is sampled and sent to the router. Once every byte of
     the prompt has reached the DE: `PromptReady` to the DE and `PrefillDone` to the router. The
     engine serves its mail between layers (`serve_queued`), so a request whose copies end
     during the next forward is announced then, not after that forward.
"""

from __future__ import annotations

import time
from collections import deque

import torch

from ...core.measured import PROBE_CACHED_TOKENS, PROBE_NEW_TOKENS, causal_keys
from ...core.policy import Budget, form_prefill_batch, prefill_budgets
from ...core.snapshot import BatchCandidate
from ...core.request import RequestId
from ...metrics.timeline import PE_TO_DE
from .base import CopyDone, CopyKind, EngineBase, EngineSpec, ReadFinished
from .relay import Relays
from .kv_stream import PrefillKvStream
from .prefill_request import PrefillRequest
from .stages import PrefillStage
from .logprobs import first_tokens
from ..protocol import (Cancel, EngineRole, FirstToken, Hello, HitReady, LayerDropped, LayerReady, PrefillAssign,
                       PrefillDone, PromptReady, ReadDone, RelayAssign)


class PrefillEngine(EngineBase):
    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        name, size = spec.landing
        from ..transport import ShmRegion

        self.landing = self._attached.view(ShmRegion(name, 0, size))
        self.peers.expose(name, self.landing)  # DEs write pulled layers here (engine/peers.py)
        self.landing_bytes = size
        self.reqs: dict[int, PrefillRequest] = {}
        self.queue: deque[PrefillRequest] = deque()
        self.attn_flops_per_s, self.prefill_tokens_per_s = self._profile()
        self.tbpl = self.layout.kv_bytes_per_token_per_layer
        self._in_forward: set[int] = set()  # the running forward's requests (the timeline's `transfer`)
        self.relays = Relays(self)  # hits read here for DEs that prefill them (+selective, relay.py)
        self.on_reconfigured()

    def on_reconfigured(self) -> None:
        """Batch budgets and load depth follow the mode (docs/paper.md §3.5; layerwise or not)."""
        cfg = self.cfg
        depth = 2 if self.features.layerwise_prefill else self.mcfg.num_layers
        landing = Budget("landing_bytes", lambda c, n: c * self.tbpl * depth, self.landing_bytes)
        # the quota's attention work (config: the paper PE's 300 ms), in this model's FLOPs
        self.budgets = prefill_budgets(self.features.dualpath_scheduler, self.attention_flops,
                                       cfg.scheduler.compute_quota_s * cfg.engines.quota_attention_flops_per_s,
                                       cfg.scheduler.basic_tokens_per_forward, landing)
        self.kv = PrefillKvStream(self, self.landing, self.features.layerwise_prefill, depth, self.model.dtype)

    def release_views(self) -> None:
        self.landing = None
        self.kv.release_views()

    # --- profile: the "profiled curve" behind the quota and beta (docs/paper.md §3.2, §3.5) -------------
    def attention_flops(self, cached: int, n: int) -> float:
        m = self.mcfg
        keys = n * (cached + 1) + n * (n - 1) / 2  # causal: token i sees cached + i + 1 keys
        return 4.0 * m.num_heads * m.head_dim * m.num_layers * keys

    def _profile(self) -> tuple[float, float]:
        m = self.model
        g = torch.Generator().manual_seed(0)
        c, n = PROBE_CACHED_TOKENS, PROBE_NEW_TOKENS  # the simulator's local preset reads the same point
        ids = torch.randint(0, self.mcfg.vocab_size, (c + n,), generator=g).tolist()

        def timed(cached: int) -> float:
            kv = None
            if cached:
                pre = m.prefill([(0, ids[:cached])])
                kv = [[layer[0]] for layer in pre.new_kv]
            t0 = time.perf_counter()
            m.prefill([(cached, ids[cached : cached + n])], kv)
            return time.perf_counter() - t0

        timed(0)  # warm-up
        t0, t1 = timed(0), timed(c)
        attn = max(t1 - t0, 1e-6)
        return self.attention_flops(c, n) / attn, (c + n) / t1

    # --- control loop ---------------------------------------------------------------------
    def run(self) -> None:
        self.mail.to_router(Hello(self.spec.engine, EngineRole.PREFILL, self.spec.endpoint, 0, self.buffers[self.node].nbytes,
                             self.prefill_tokens_per_s, self.attn_flops_per_s, *self.own_buffer()))
        while not self._stop:
            batch = self._form_batch()
            if batch:
                self._forward(batch)
                self.maybe_report_counters()
            else:
                self.pump(lambda: self._stop or self._has_work(), timeout_s=0.05)
        self.close()

    def _has_work(self) -> bool:
        return any(r.computable for r in self.queue)

    def handlers(self) -> dict:
        return {**super().handlers(), PrefillAssign: self._assign, ReadFinished: self._read_finished, RelayAssign: self._relay,
                HitReady: self._hit_ready, LayerReady: self._layer_ready, CopyDone: self._copy_done,
                Cancel: self._on_cancel, LayerDropped: self._layer_dropped}

    def _relay(self, a: RelayAssign) -> None:
        self.relays.start(a)

    def _read_finished(self, msg: ReadFinished) -> None:
        if msg.rid in self.relays:  # a hit read for a DE that prefills it (relay.py)
            self.relays.read(msg)
            return
        self._part_loaded(msg.rid, msg.ok_blocks, own=True, report=msg.nbytes)

    def _layer_ready(self, msg: LayerReady) -> None:
        self.kv.layer_ready(msg)  # the stream of the moment (a reconfigure builds a new one)

    def _layer_dropped(self, msg: LayerDropped) -> None:
        self.kv.layer_dropped(msg)

    def _hit_ready(self, msg: HitReady) -> None:
        if msg.rid in self.reqs:
            self._part_loaded(msg.rid, msg.ok_blocks, own=False, report=None)
        else:
            self.mail.hold(msg.rid, msg)  # the DE's read finished before our assignment came

    def _on_cancel(self, msg: Cancel) -> None:
        r = self.reqs.get(msg.rid)
        if r is not None:
            r.cancelled = True  # dropped at the next batch formation unless in flight
            if r.stage is PrefillStage.LOADING and not r.own_read_pending:
                self._drop(r)  # waits only for its DE's HitReady (maybe a dead DE's): nothing in flight here

    def on_peer_lost(self) -> None:
        self.kv.peer_lost()  # a forward waiting for that DE's layers goes on (its items are cancelled)

    def _assign(self, a: PrefillAssign) -> None:
        r = PrefillRequest.assigned(a)
        self.reqs[a.rid] = r
        self.queue.append(r)
        if a.hit_tokens == 0:
            r.move(PrefillStage.READY)
        elif r.own_read_pending:  # the PE path's hit, or a split read's PE part (its prefix)
            nb = r.own_hit_tokens // self.cfg.block_tokens
            self.storage.read_blocks(a.rid, a.hit_digests[:nb], self.node, a.pe_offsets[:nb])
        self.replay_held(a.rid)

    def _part_loaded(self, rid: int, ok_blocks: int, own: bool, report: int | None) -> None:
        """This node's read (`own`, `report` its bytes) or the DE's (HitReady) is in; the request
        is ready once every part is (prefill_request.py: a block that failed its checksum is recomputed)."""
        r = self.reqs.get(rid)
        if report is not None:
            self.mail.to_router(ReadDone(rid, self.spec.engine, r.own_hit_tokens if r else 0, report, ok_blocks))
        if r is None:
            return
        if r.part_loaded(own, ok_blocks, self.cfg.block_tokens):
            r.move(PrefillStage.READY)
        elif r.cancelled and not r.own_read_pending:
            self._drop(r)  # a cancelled split read: its own read is in, the DE's may never come

    def _drop(self, r: PrefillRequest) -> None:
        self.queue.remove(r)
        del self.reqs[r.assign.rid]
        self.mail.ended(r.assign.rid)
        self.mail.to_router(PrefillDone(r.assign.rid, self.spec.engine))

    # --- batch ------------------------------------------------------------------------------
    def _form_batch(self) -> list[tuple[PrefillRequest, int]]:
        while True:
            msg = self.mail.recv(0)
            if msg is None:
                break
            self.handle(msg)
        for r in [r for r in self.queue if r.cancelled and r.computable]:
            self._drop(r)
        eligible = [r for r in self.queue if r.computable]
        cands = (BatchCandidate(RequestId(r.assign.rid, 0), r.cached, r.remaining) for r in eligible)
        entries = form_prefill_batch(cands, self.budgets)
        return [(eligible[i], e.compute_tokens) for i, e in enumerate(entries)]

    # --- forward: per layer, wait for its KV, compute, save (kv_stream.py) ----------------------
    def _forward(self, batch: list[tuple[PrefillRequest, int]]) -> None:
        t_start, fwd_s = time.perf_counter(), self.timeline.now_s()
        self._in_forward = {r.assign.rid for r, _ in batch}
        stream = self.kv
        stream.start_load(batch)
        state = self.model.begin_prefill([(r.cached, r.prompt[r.cached : r.cached + n]) for r, n in batch])
        compute_s = 0.0
        for l in range(self.mcfg.num_layers):
            cached_kv = stream.wait_for_layer_load(l)
            t0 = time.perf_counter()
            new = self.model.prefill_layer(state, l, cached_kv)
            compute_s += time.perf_counter() - t0
            stream.save_kv_layer(l, new)
            self.serve_queued()  # e.g. the last forward's PD copies done: its requests' DEs start now
        t0 = time.perf_counter()
        logits = self.model.finish_prefill(state)
        compute_s += time.perf_counter() - t0
        stream.flush_saves()
        self._in_forward = set()  # every PD copy of the forward is out: a request with none pending is sent
        for r, _ in batch:
            if r.pending_pd == 0:
                self._pd_sent(r.assign.rid)
        self.counters.busy_s += compute_s
        self.counters.forwards += 1
        self.counters.forward_items += len(batch)
        self.counters.fit_items += sum(n for _, n in batch)
        keys = sum(causal_keys(n, r.cached) for r, n in batch)
        self.counters.fit_keys += keys
        for i, (r, n) in enumerate(batch):
            if r.assign.rid in stream.poisoned:
                r.restart()  # its outputs came from KV that failed its checksums: recompute, never use
                continue
            r.cached += n
            r.hit_sent = True  # its own part of the hit went to the DE with this forward (kv_stream.py)
            if r.remaining == 0:
                self._first_token(r, logits[i])
        stream.wait_for_save()
        self.last_forward_s = time.perf_counter() - t_start
        self.timeline.until_now(self.track, "prefill", fwd_s, None,  # keys, model_s: fidelity/calibration.py
                                lambda: {"requests": [r.assign.rid for r, _ in batch], "tokens": sum(n for _, n in batch),
                                         "keys": keys, "model_s": compute_s})

    def _pd_sent(self, rid: int) -> None:
        """Every PD copy of the request's last forward has landed: its `transfer` span ends."""
        self.timeline.end(("pd", rid), self.cnic_track, "transfer", rid, PE_TO_DE)

    def _copy_done(self, msg: CopyDone) -> None:
        if msg.kind == CopyKind.RELAY:
            self.relays.sent(msg)
            return
        r = self.reqs.get(msg.rid)
        if r is None:
            return
        r.pending_pd -= 1
        if r.pending_pd == 0 and msg.rid not in self._in_forward:  # mid-forward, more layers follow
            self._pd_sent(msg.rid)
        if r.pending_pd == 0 and r.stage is PrefillStage.COMPUTED:
            self._finish(r)

    def _first_token(self, r: PrefillRequest, logits: torch.Tensor) -> None:
        a = r.assign
        eos = tuple(self.mcfg.eos_token_ids) if a.suppress_eos else None
        firsts = first_tokens(logits, a.n, a.temperature, a.top_p, a.seed, a.logprobs, eos)  # each choice's (OpenAI's n)
        (r.first_token, r.first_logprobs), r.more_first = firsts[0], firsts[1:]
        r.move(PrefillStage.COMPUTED)
        if not r.cancelled:
            self.mail.to_router(FirstToken(a.rid, r.first_token, r.hit_tokens, r.first_logprobs, r.more_first))
        if r.pending_pd == 0:
            self._finish(r)

    def _finish(self, r: PrefillRequest) -> None:
        a = r.assign
        if not r.cancelled:
            self.peers.send_after_writes(a.de_endpoint, a.de_data, PromptReady(a.rid, r.first_token, r.hit_tokens, r.pd_sums,
                                                                                   r.first_logprobs, r.more_first))
        self.queue.remove(r)
        del self.reqs[a.rid]
        self.mail.ended(a.rid)
        self.mail.to_router(PrefillDone(a.rid, self.spec.engine))
