"""A prefill engine group (one node, all GPUs in lockstep: DP attention + EP).

Numbered path of one forward (docs/paper.md §1.3, §3.5):
  1. `try_start`: when the group is idle, each GPU takes its ready requests in FIFO order within
     the budgets (DualPath: compute quota on predicted attention time; basic: tokens per forward,
     plus HBM when prefill is not layerwise), the last one possibly chunked. A request whose
     prompt KV will need room in its DE buffer reserves it now; if it cannot, it is passed over
     for this forward and the group waits on that buffer.
  2. Layerwise: hit-KV Layer Blocks stream in (PE path: PE buffer -> loopback on the PE's CNIC;
     DE path: DE buffer -> DE CNIC -> PE CNIC) while layers compute, and each layer's new KV streams
     to the DE buffer (all of it on the PE path, only the miss on the DE path; a split read's PE
     part streams as the PE path's, the rest as the DE path's). Flows are aggregated per PE GPU
     and forward (see `_start_streams`). The forward ends when compute and incoming streams are done.
     Not layerwise: the whole cached KV is loaded first, then compute, then the PD transfer; the
     GPU cannot start its next forward before its KV left HBM.
  3. `_forward_done`: chunks advance; a fully computed request emits its first token, frees its
     PE buffer and PE load, and goes to the DE once its PD transfers have landed.
"""

from __future__ import annotations

from collections import deque
from functools import partial
from typing import Iterator

from ..core.lanes import Lane
from ..core.phase import Phase
from ..core.policy import Budget, form_prefill_batch, prefill_budgets
from ..core.snapshot import BatchCandidate, ReadSide
from ..metrics.timeline import ROUTER
from .ep_comm import ep_comm_for
from .events import PRIO_COMPLETE
from .lifecycle import SimContext, TurnLifecycle
from .links import Flow, Network
from .state import Engine, Node, SimRequest


class Forward:
    __slots__ = ("entries", "pending", "compute_s", "pd_flows", "tokens_per_gpu", "start_s")

    def __init__(self, entries: list[tuple[Engine, SimRequest, int]], compute_s: float, start_s: float) -> None:
        self.entries = entries
        self.start_s = start_s
        self.pending = 0
        self.compute_s = compute_s
        self.pd_flows = 0
        self.tokens_per_gpu: list[int] = []  # new tokens each GPU computes (EP bursts, ep_comm.py)


class DeCnics:
    """The paper presets' CNICs: KV streamed from DE buffers is one flow per PE GPU, limited where
    the streams converge (the PE CNIC-in), each sending DE CNIC-out's bytes booked on its ledger;
    the PD transfer's bytes are booked on each receiving DE CNIC-in (`_start_streams`)."""

    def stream_from_des(self, group: "PrefillGroup", fwd: Forward, eng: Engine, remote: float,
                        sources: dict, rids: list[int]) -> None:
        net = group.ctx.net
        fwd.pending += 1
        for src, nbytes, _ in sources.values():
            net.book(src.cnic_out, Lane.KV, nbytes)
        net.start(remote, Lane.KV, (eng.cnic_in,), group._stream_done,
                  (fwd, eng.cnic_track, "transfer", {"requests": rids, "direction": "DE->PE"}))

    def book_pd_arrivals(self, net: Network, reqs: list[tuple[SimRequest, float]]) -> None:
        for req, nbytes in reqs:
            assert req.de is not None  # a request prefills once its DE is chosen
            net.book(req.de.cnic_in, Lane.KV, nbytes)


class ArbiterPerDe(DeCnics):
    """The `local` preset's CNICs, as the runtime's: each DE's arbiter writes the layers pulled from
    it, one flow per sending DE on its own link; the DE's arbiter moves none of a PD transfer."""

    def stream_from_des(self, group: "PrefillGroup", fwd: Forward, eng: Engine, remote: float,
                        sources: dict, rids: list[int]) -> None:
        for src, nbytes, src_rids in sources.values():
            fwd.pending += 1
            group.ctx.net.start(nbytes, Lane.KV, (src.cnic_out,), group._stream_done,
                                (fwd, src.cnic_track, "transfer", {"requests": src_rids, "direction": "DE->PE"}))

    def book_pd_arrivals(self, net: Network, reqs: list[tuple[SimRequest, float]]) -> None:
        pass


class PrefillGroup:
    def __init__(self, ctx: SimContext, life: TurnLifecycle, node: Node) -> None:
        self.ctx = ctx
        self.life = life
        self.node = node
        self.busy = False
        self.compute_end_s = -1.0  # when the running forward's compute ends (once it has started)
        self.busy_s = 0.0
        self.num_forwards = 0
        self.stream_bytes = 0.0  # cached KV streamed into PE HBM (all chunks)
        self.pd_bytes = 0.0  # KV sent PE -> DE buffers
        self.attention_balance: list[tuple[float, float]] = []  # (time, max/avg GPU attention) per forward
        f = ctx.features
        sched = ctx.cfg.scheduler
        cm = ctx.compute
        self.budgets = prefill_budgets(f.dualpath_scheduler, cm.quota_attention_s, sched.compute_quota_s,
                                       sched.basic_tokens_per_forward, _memory_budget(ctx))
        self.pipeline = pipeline_for(f.io_free, f.layerwise_prefill)
        self.ep = ep_comm_for(ctx.cfg, ctx.net, node, prefill=True)  # None: no EP bytes on the CNICs
        cl = ctx.cfg.cluster
        self.cnics: DeCnics = ArbiterPerDe() if cl.cnic_as_runtime_arbiter else DeCnics()  # who carries DE<->PE KV, once
        self.frees_host_copies = not cl.buffers_at_placement  # else the router frees the PE's regions at PrefillDone

    # --- 1. batch formation ----------------------------------------------------------------
    def _candidates(self, eng: Engine, picked: list[SimRequest]) -> Iterator[BatchCandidate]:
        """FIFO over the GPU's ready requests. One whose DE buffer is full is passed over for this
        forward (and the group waits on that buffer): holding the line for it could deadlock with
        DE-path requests behind it that occupy the same buffer and only free it after prefill."""
        need_of = self.ctx.io.de_buffer_need_at_prefill
        tentative: dict[int, float] = {}
        for req in eng.batch_queue:
            need = need_of(req)
            if need:
                assert req.de is not None
                dn = req.de.node
                if dn.buffer_free_bytes - tentative.get(dn.nid, 0.0) < need:
                    dn.waiters[id(self)] = self
                    continue
                tentative[dn.nid] = tentative.get(dn.nid, 0.0) + need
            picked.append(req)
            yield BatchCandidate(req.rid, req.cached_tokens, req.remaining_tokens)

    def try_start(self) -> None:
        if self.busy:
            return
        ctx = self.ctx
        entries: list[tuple[Engine, SimRequest, int]] = []
        max_attn_s = 0.0
        sum_attn_s = 0.0
        total_tokens = 0
        for eng in self.node.engines:
            if not eng.batch_queue:
                continue
            picked: list[SimRequest] = []
            batch = form_prefill_batch(self._candidates(eng, picked), self.budgets)
            attn_s = 0.0
            for req, be in zip(picked, batch):
                need = self.ctx.io.de_buffer_need_at_prefill(req)
                if need:
                    assert req.de is not None
                    req.de.node.reserve(need)
                    req.de_buffer_bytes += need
                entries.append((eng, req, be.compute_tokens))
                attn_s += ctx.compute.attention_time_s(be.cached_tokens, be.compute_tokens)
                total_tokens += be.compute_tokens
            max_attn_s = attn_s if attn_s > max_attn_s else max_attn_s  # max(), written out
            sum_attn_s += attn_s
        if not entries:
            return
        if sum_attn_s > 0:
            self.attention_balance.append((ctx.loop.now_s, max_attn_s * len(self.node.engines) / sum_attn_s))
        self.busy = True
        self.num_forwards += 1
        fwd = Forward(entries, ctx.compute.prefill_forward_s(max_attn_s, total_tokens), ctx.loop.now_s)
        if self.ep is not None:
            fwd.tokens_per_gpu = [0] * len(self.node.engines)
            for eng, _, ntok in entries:
                fwd.tokens_per_gpu[eng.index] += ntok
        now = ctx.loop.now_s
        for _, req, _ in entries:
            req.to(Phase.PREFILLING)
            if req.t_prefill_start < 0:
                req.t_prefill_start = now
        self.pipeline.start(self, fwd)

    # --- 2. streams and compute ------------------------------------------------------------
    def _start_streams(self, fwd: Forward) -> None:
        """Cached KV into PE HBM. Per PE GPU one loopback flow (PE buffer -> its own CNIC, both
        directions) and one flow for everything arriving from DE buffers. The remote flow is rate-limited where the streams converge, on the PE GPU's CNIC-in
        (incast); each sending DE CNIC has its bytes booked on its ledger but does not limit the
        rate. Per-pair flows would be exact but cost O(pairs^2) re-rates per forward (a PE GPU
        hears from up to every DE GPU), and DE CNICs carry little else (one H2D per request).
        With `cnic_as_runtime_arbiter` (the `local` preset) each DE's part is its own flow on the
        DE's link, as the runtime's DE arbiter writes the pulled layers."""
        ctx = self.ctx
        kvbpt = ctx.kv_bytes_per_token
        per_gpu: dict[int, list] = {}
        for eng, req, _ in fwd.entries:
            if req.cached_tokens == 0:
                continue
            acc = per_gpu.setdefault(eng.eid, [eng, 0, 0, {}, [], []])  # + the requests of each flow (timeline)
            nbytes = req.cached_tokens * kvbpt
            if req.pe_part_tokens:  # a split read: its PE part from the PE buffer, the rest from the DE's
                acc[1] += req.pe_part_tokens * kvbpt
                acc[4].append(req.rid)
                nbytes -= req.pe_part_tokens * kvbpt
            if req.side is ReadSide.DECODE:
                assert req.de is not None
                acc[2] += nbytes
                acc[5].append(req.rid)
                src = acc[3].setdefault(req.de.eid, [req.de, 0, []])
                src[1] += nbytes
                src[2].append(req.rid)
            else:
                acc[1] += nbytes
                acc[4].append(req.rid)
        for eng, local, remote, sources, local_rids, remote_rids in per_gpu.values():
            self.stream_bytes += local + remote
            if local:
                fwd.pending += 1
                ctx.net.start(local, Lane.KV, (eng.cnic_out, eng.cnic_in), self._stream_done,
                              (fwd, eng.cnic_track, "h2d", {"requests": local_rids}))
            if remote:
                self.cnics.stream_from_des(self, fwd, eng, remote, sources, remote_rids)

    def _stream_done(self, flow: Flow) -> None:
        fwd, track, name, args = flow.tag  # args: the timeline's (metrics/timeline.py)
        self.ctx.timeline.span(track, name, flow.start_s, self.ctx.loop.now_s, None, args)
        fwd.pending -= 1
        if fwd.pending == 0:
            self.pipeline.loaded(self, fwd)

    def _free_loaded_host_copies(self, fwd: Forward) -> None:
        """Not layerwise: once a request's whole hit KV is in HBM, its PE-buffer copy is no longer
        needed, unless a later chunk will load it again. Not when placement took it
        (`buffers_at_placement`): the router frees the PE's regions at PrefillDone."""
        if not self.frees_host_copies:
            return
        for eng, req, ntok in fwd.entries:
            if req.pe_buffer_bytes and ntok == req.remaining_tokens:
                self.life.release_buffer(eng.node, req.pe_buffer_bytes)
                req.pe_buffer_bytes = 0.0

    def _start_compute(self, fwd: Forward) -> None:
        if self.ep is not None:  # the EP bursts' time under the KV on the GPUs' CNICs now
            fwd.compute_s += self.ep.extra_s(fwd.tokens_per_gpu)
            self.ep.book(fwd.tokens_per_gpu, 1.0)
            self.ep.reserve(fwd.tokens_per_gpu, fwd.compute_s)
        fwd.pending += 1
        self.busy_s += fwd.compute_s
        self.compute_end_s = self.ctx.loop.now_s + fwd.compute_s
        self.ctx.loop.call_at(self.compute_end_s, self._compute_done, fwd, PRIO_COMPLETE)

    def busy_past_now(self) -> bool:
        """True when the group cannot be idle again at the current instant: its forward's compute
        is still running. A forward ends only after its compute (then streams or PD transfers), so
        `try_start` would return at once at any later event of this instant."""
        return self.busy and self.compute_end_s > self.ctx.loop.now_s

    def _compute_done(self, fwd: Forward) -> None:
        if self.ep is not None:
            self.ep.reserve(None, 0.0)
        fwd.pending -= 1
        self.pipeline.computed(self, fwd)

    def _start_pd(self, fwd: Forward) -> None:
        """KV of this forward to the DE buffers: per PE GPU one flow, rate-limited on its CNIC-out
        where it fans out; each receiving DE CNIC-in has its bytes booked (see `_start_streams`)."""
        ctx = self.ctx
        kvbpt = ctx.kv_bytes_per_token
        per_gpu: dict[int, list] = {}
        for eng, req, ntok in fwd.entries:
            tokens = ntok
            if not req.hit_sent and (req.side is ReadSide.PREFILL or req.pe_part_tokens):
                tokens += req.pe_part_tokens or req.hit_tokens  # the PE path sends the hit (a split: its PE part) on too
                req.hit_sent = True
            acc = per_gpu.setdefault(eng.eid, [eng, 0, []])
            acc[1] += tokens * kvbpt
            acc[2].append((req, tokens * kvbpt))
            req.pending_pd += 1
        for eng, nbytes, reqs in per_gpu.values():
            self.pd_bytes += nbytes
            fwd.pd_flows += 1
            self.cnics.book_pd_arrivals(ctx.net, reqs)
            ctx.net.start(nbytes, Lane.KV, (eng.cnic_out,), self._pd_done, (fwd, reqs, eng))

    def _pd_done(self, flow: Flow) -> None:
        fwd, reqs, eng = flow.tag
        self.ctx.timeline.span(eng.cnic_track, "transfer", flow.start_s, self.ctx.loop.now_s, None,
                               partial(_transfer_args, reqs))
        for req, nbytes in reqs:
            req.pending_pd -= 1
            req.delivered_bytes += nbytes
            if req.pending_pd == 0 and req.computed:
                self.life.kv_landed(req)
        fwd.pd_flows -= 1
        if fwd.pd_flows == 0:
            self.pipeline.sent(self, fwd)

    # --- 3. completion ---------------------------------------------------------------------
    def _forward_done(self, fwd: Forward) -> None:
        self._advance_chunks(fwd)
        self._release(fwd)

    def _advance_chunks(self, fwd: Forward) -> None:
        for eng, req, ntok in fwd.entries:
            req.cached_tokens += ntok
            req.remaining_tokens -= ntok
            if req.remaining_tokens > 0:
                req.to(Phase.PREFILL_READY)
                continue
            self.ctx.timeline.instant(ROUTER, "first_token", self.ctx.loop.now_s, req.rid)
            self.life.prefill_computed(req)

    def _release(self, fwd: Forward) -> None:
        for eng in {id(e): e for e, _, _ in fwd.entries}.values():
            self.ctx.timeline.span(eng.track, "prefill", fwd.start_s, self.ctx.loop.now_s, None, partial(_forward_args, fwd, eng))
            if any(r.computed for r in eng.batch_queue):
                eng.batch_queue = deque(r for r in eng.batch_queue if not r.computed)
        self.busy = False
        self.life.kick_prefill(self.node.nid)


# --- how a forward's KV moves around its compute: one pipeline per mode, chosen once ------------
class Pipeline:
    """Layerwise (docs/paper.md §1.1, §1.3): the cached KV streams in and the new KV streams out while the
    layers compute; the forward ends when compute and the incoming streams are done, and the GPU
    does not wait for the outgoing streams."""

    def start(self, g: PrefillGroup, fwd: Forward) -> None:
        g._start_streams(fwd)
        g._start_pd(fwd)
        g._start_compute(fwd)

    def loaded(self, g: PrefillGroup, fwd: Forward) -> None:
        """Every incoming stream and the compute are done (`fwd.pending` reached 0 on a stream)."""
        g._forward_done(fwd)

    def computed(self, g: PrefillGroup, fwd: Forward) -> None:
        if fwd.pending == 0:
            g._forward_done(fwd)

    def sent(self, g: PrefillGroup, fwd: Forward) -> None:
        """Every outgoing PD flow of the forward has landed (`_pd_done` counted its bytes)."""


class WholeKvPipeline(Pipeline):
    """Not layerwise: the whole cached KV loads first, then compute, then the whole new KV (PE
    path: and the hit) goes to the DE; the GPU starts nothing until its KV has left HBM."""

    def start(self, g: PrefillGroup, fwd: Forward) -> None:
        g._start_streams(fwd)
        if fwd.pending == 0:
            g._start_compute(fwd)

    def loaded(self, g: PrefillGroup, fwd: Forward) -> None:
        g._free_loaded_host_copies(fwd)
        g._start_compute(fwd)

    def computed(self, g: PrefillGroup, fwd: Forward) -> None:
        g._start_pd(fwd)
        g._advance_chunks(fwd)
        if fwd.pd_flows == 0:
            g._release(fwd)

    def sent(self, g: PrefillGroup, fwd: Forward) -> None:
        g._release(fwd)


class FreePipeline(Pipeline):
    """The oracle's free network: compute only; the KV is where it is needed at once."""

    def start(self, g: PrefillGroup, fwd: Forward) -> None:
        g._start_compute(fwd)

    def computed(self, g: PrefillGroup, fwd: Forward) -> None:
        """The chunk's KV (and, with the last chunk, the hit) is in the DE buffer at once."""
        kvbpt = g.ctx.kv_bytes_per_token
        for _, req, ntok in fwd.entries:
            req.delivered_bytes += ntok * kvbpt
            if req.remaining_tokens - ntok <= 0:
                req.delivered_bytes += req.hit_tokens * kvbpt
        if fwd.pending == 0:
            g._forward_done(fwd)


def _forward_args(fwd: Forward, eng: Engine) -> dict:
    """A forward's timeline args on one GPU (metrics/timeline.py): its requests and new tokens."""
    mine = [(req, ntok) for e, req, ntok in fwd.entries if e is eng]
    return {"requests": [req.rid for req, _ in mine], "tokens": sum(ntok for _, ntok in mine)}


def _transfer_args(reqs: list[tuple[SimRequest, int]]) -> dict:
    return {"requests": [req.rid for req, _ in reqs], "direction": "PE->DE", "bytes": sum(b for _, b in reqs)}


def _memory_budget(ctx: SimContext) -> Budget | None:
    """What a PE's memory holds of a batch. Paper cluster: without layerwise prefill the whole
    batch's KV (cached and new) sits in HBM; layerwise, a layer at a time (no limit). `local`
    preset: the runtime's landing zone holds the batch's cached KV, two layers of it when
    layerwise, every layer otherwise (runtime/engine/prefill.py: `on_reconfigured`)."""
    kvbpt = ctx.kv_bytes_per_token
    layerwise = ctx.features.layerwise_prefill
    if ctx.cfg.local is not None:
        layers = ctx.cfg.cluster.model_spec.num_layers
        depth = min(2, layers) if layerwise else layers
        return Budget("landing_bytes", lambda c, n: c * kvbpt * depth / layers, ctx.pe_kv_hbm_bytes)
    if layerwise:
        return None
    return Budget("hbm_bytes", lambda c, n: (c + n) * kvbpt, ctx.pe_kv_hbm_bytes)


def pipeline_for(io_free: bool, layerwise: bool) -> Pipeline:
    if io_free:
        return FreePipeline()
    return Pipeline() if layerwise else WholeKvPipeline()
