"""The KV side of one prefill forward, in the four hooks vLLM's KV connector names
(`start_load_kv`, `wait_for_layer_load`, `save_kv_layer`, `wait_for_save`).

The PE's forward is, for each layer: wait for that layer's cached KV, compute, save the new KV:

    stream.start_load(batch)                   # 1. the first `depth` layers start loading
    for l in range(num_layers):
        cached = stream.wait_for_layer_load(l) # 2. layer l is in the landing zone; l + depth - 1 issued
        new = model.prefill_layer(state, l, cached)
        stream.save_kv_layer(l, new)           # 3. layerwise: layer l leaves for the DE now
    logits = model.finish_prefill(state)
    stream.flush_saves()                       # 4. whole-KV mode: every layer leaves now
    ... sample first tokens ...
    stream.wait_for_save()                     # 5. whole-KV mode: HBM holds the KV until it left

Loads. The landing zone ("HBM") holds `depth` layers of the batch's cached KV, one slot per layer
mod depth: 2 in layerwise mode (layer l + 1 loads while layer l computes, docs/paper.md §1.3), every
layer otherwise (the whole cached KV loads before compute). PE path: this engine's CNIC arbiter
copies the layer from the node's host buffer; DE path: a `LayerPull` asks the DE, whose arbiter
writes it here and answers `LayerReady`, which the engine hands to `layer_ready`.

Integrity (transport/integrity.py). Every load carries the sender's checksum per block piece (in
`LayerReady`); `wait_for_layer_load` verifies the landed bytes before it returns them. A mismatch
is loaded again, at most LAYER_RETRANSMITS_MAX times per item and layer; after that the item is
`poisoned`: the forward goes on (its outputs are discarded) and the engine recomputes its KV from
its tokens. Every PD copy's sums join the request's `pd_sums`, which the DE verifies.

Saves. Layer l's new KV goes to the DE's host buffer through the arbiter (PE path: the hit once,
too, and, when a later chunk follows, back into this node's buffer for it). Each copy counts in the
request's `pending_pd`; the engine's `CopyDone` handling counts it down. The mode is fixed when the
stream is built (`on_reconfigured`), not asked per call.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from .base import CopyDone, CopyKind, EngineBase, as_tensor
from ..transport.integrity import LAYER_RETRANSMITS_MAX, bad_pieces
from .kv_region import contiguous, layer_spans
from ..model import LayerKV, layer_kv_to_bytes
from ..protocol import LayerDropped, LayerPull, LayerReady
from .prefill_request import PrefillRequest
from ..transport.shm import ShmRegion

Batch = list[tuple[PrefillRequest, int]]  # (request, tokens computed in this forward)


class PrefillKvStream:
    def __init__(self, engine: EngineBase, landing: np.ndarray, layerwise: bool, depth_layers: int,
                 compute_dtype: torch.dtype) -> None:
        self._engine = engine
        self._landing = landing
        self.layerwise = layerwise
        self.depth_layers = depth_layers
        self._compute_dtype = compute_dtype
        mcfg = engine.mcfg
        self._num_layers = mcfg.num_layers
        self._kv_shape = (mcfg.num_kv_heads, mcfg.head_dim)
        self._bytes_per_token_layer = engine.layout.kv_bytes_per_token_per_layer
        self._batch: Batch = []
        self._zone: list[int] = []  # per item: byte offset of its cached KV within one layer slot
        self._slot_bytes = 0
        # layer -> (rid, own) of the loads not landed: own, from this node's buffer; else the DE's
        self._loads_pending: dict[int, set[tuple[int, bool]]] = {}
        self._issued = -1
        self._deferred: list[list[LayerKV]] = []
        self._sums: dict[tuple[int, int], list[int]] = {}  # (layer, rid) -> the sender's sums of the load
        self._tries: dict[tuple[int, int], int] = {}  # (layer, rid) -> loads asked again
        self.poisoned: set[int] = set()  # rids of this forward whose loaded KV failed every try
        self._dropped: set[int] = set()  # rids whose DE had let them go (LayerDropped): no more loads

    def release_views(self) -> None:
        self._landing = None  # type: ignore[assignment]

    # --- 1, 2: loads ------------------------------------------------------------------------------
    def start_load(self, batch: Batch) -> None:
        self._batch = batch
        self._zone = []
        pos = 0
        for r, _ in batch:
            self._zone.append(pos)
            pos += r.cached * self._bytes_per_token_layer
        self._slot_bytes = pos
        self._loads_pending = {}
        self._issued = -1
        self._deferred = []
        self._sums, self._tries, self.poisoned, self._dropped = {}, {}, set(), set()
        self._issue_through(min(self._num_layers, self.depth_layers) - 1)

    def wait_for_layer_load(self, layer: int) -> list[LayerKV | None]:
        """Layer `layer`'s cached KV per item (None where an item has none), as views of the zone."""
        self._issue_through(min(self._num_layers - 1, layer + self.depth_layers - 1))
        landed = [r.assign.rid for r, _ in self._batch if r.cached and not self._lost(r)]
        while True:  # a lost item's own part (a split read's) lands before its zone is reused
            self._engine.pump(lambda: not self._loads_pending[layer], timeout_s=0.05)
            landed = self._verify(layer, landed)
            if not landed:
                break
        base = (layer % self.depth_layers) * self._slot_bytes
        views: list[LayerKV | None] = []
        for (r, _), off in zip(self._batch, self._zone):
            if r.cached == 0:
                views.append(None)
                continue
            buf = self._landing[base + off : base + off + r.cached * self._bytes_per_token_layer]
            if self._lost(r):  # its DE died or let it go: it is cancelled; zeros, never stale bytes
                buf[:] = 0
            kv = as_tensor(buf, self._engine.dtype, (r.cached, 2, *self._kv_shape))
            views.append(LayerKV(kv.to(self._compute_dtype)))
        return views

    def layer_ready(self, msg: LayerReady) -> None:
        """One load of an item's layer landed (a split read's item has two: its own part, the DE's)."""
        pending = self._loads_pending.get(msg.layer)
        if pending is not None and (msg.rid, msg.own) in pending:
            pending.discard((msg.rid, msg.own))
            self._sums.setdefault((msg.layer, msg.rid), []).extend(msg.sums)  # both from the item's offset
            if msg.own and msg.layer == self._num_layers - 1:  # its own part is in (`_issue_item` began it)
                self._engine.timeline.end(("h2d", msg.rid), self._engine.cnic_track, "h2d", msg.rid)

    def layer_dropped(self, msg: LayerDropped) -> None:
        """The DE had let the request go (cancelled): this load never comes, nor do later ones."""
        self._dropped.add(msg.rid)
        pending = self._loads_pending.get(msg.layer)
        if pending is not None:
            pending.discard((msg.rid, False))

    def _verify(self, layer: int, rids: list[int]) -> list[int]:
        """Check the loads of `rids` that landed against their sender's sums; ask the failed ones
        again (they are returned, to be checked once landed) or, out of tries, poison them."""
        eng = self._engine
        base = (layer % self.depth_layers) * self._slot_bytes
        again = []
        for (r, _), off in zip(self._batch, self._zone):
            rid = r.assign.rid
            sums = self._sums.pop((layer, rid), None)
            if rid not in rids or sums is None or self._lost(r):
                continue
            bad = bad_pieces(self._landing, sums, base + off)
            if not bad:
                continue
            eng.counters.layer_checksum_failures += len(bad)
            tries = self._tries.get((layer, rid), 0)
            if rid in self.poisoned:
                continue
            if tries >= LAYER_RETRANSMITS_MAX:
                self.poisoned.add(rid)
                eng.counters.kv_recomputes += 1
                continue
            self._tries[(layer, rid)] = tries + 1
            eng.counters.layer_retransmits += 1
            self._issue_item(layer, r, base + off)  # every part of it again
            again.append(rid)
        return again

    def peer_lost(self) -> None:
        """A DE was fenced (`engine.lost_engines`): its pulls never answer; stop waiting for them."""
        for waiting in self._loads_pending.values():  # a split read's own part still lands
            waiting.difference_update([(r.assign.rid, False) for r, _ in self._batch if self._lost(r)])

    def _lost(self, r: PrefillRequest) -> bool:
        """A DE-path (or split) item whose DE loads will not come: its DE died, or it let the request go."""
        return not r.pe_path and (r.assign.de_engine in self._engine.lost_engines or r.assign.rid in self._dropped)

    def _issue_through(self, layer: int) -> None:
        while self._issued < layer:
            self._issued += 1
            self._issue(self._issued)

    def _issue(self, layer: int) -> None:
        base = (layer % self.depth_layers) * self._slot_bytes
        self._loads_pending[layer] = set()
        for (r, _), off in zip(self._batch, self._zone):
            if r.cached == 0 or self._lost(r) or r.assign.rid in self.poisoned:
                continue  # a poisoned item's outputs are discarded: its later layers need no load
            self._issue_item(layer, r, base + off)

    def _issue_item(self, layer: int, r: PrefillRequest, at_bytes: int) -> None:
        """Load layer `layer` of `r`'s cached KV into the landing zone at `at_bytes`: tokens
        [0, own) copied from this node's buffer (PE path: all; a split read: its PE part), the rest
        [own, cached) written by the DE on a `LayerPull` (DE path: all; a split read: its DE part)."""
        eng, a, rid, own = self._engine, r.assign, r.assign.rid, r.own_tokens
        pending = self._loads_pending[layer]
        if own:
            pending.add((rid, True))
            eng.timeline.begin(("h2d", rid))
            spans = layer_spans(eng.layout, a.pe_offsets, layer, 0, own)
            dst = self._landing[at_bytes : at_bytes + own * self._bytes_per_token_layer]
            eng.copy_checked(eng.buffers[eng.spec.engine], spans, dst, contiguous(0, dst.nbytes),
                             lambda sums: eng.mail.to_self(LayerReady(rid, layer, sums, own=True)))
        if own < r.cached:
            pending.add((rid, False))
            eng.mail.send(a.de_endpoint, LayerPull(rid, layer, r.cached, eng.spec.landing[0], at_bytes, eng.spec.endpoint,
                                              eng.peers.data_endpoint, own))

    # --- 3, 4, 5: saves ---------------------------------------------------------------------------
    def save_kv_layer(self, layer: int, new: list[LayerKV]) -> None:
        if self.layerwise:
            self._send(layer, new)
        else:
            self._deferred.append(new)

    def flush_saves(self) -> None:
        """Whole-KV mode: the deferred layers leave now (nothing is deferred in layerwise mode)."""
        for layer, new in enumerate(self._deferred):
            self._send(layer, new)
        self._deferred = []

    def wait_for_save(self) -> None:
        """Whole-KV mode: the batch's KV occupies HBM until it has left, so the next forward waits.
        Layerwise mode: each layer was copied out as it was saved; nothing to wait for."""
        if not self.layerwise:
            self._engine.pump(lambda: all(r.pending_pd == 0 for r, _ in self._batch), timeout_s=0.05)

    def _send(self, layer: int, new: list[LayerKV]) -> None:
        """Layer `layer`'s KV to the DE buffer: the new tokens (and, PE path, the hit once)."""
        eng = self._engine
        own = eng.buffers[eng.spec.engine]
        for (r, n), kv in zip(self._batch, new):
            a = r.assign
            data = np.frombuffer(layer_kv_to_bytes(kv, eng.dtype), dtype=np.uint8)  # D2H on a GPU
            new_spans = layer_spans(eng.layout, a.de_offsets, layer, r.cached, r.cached + n)
            self._copy_pd(r, layer, data, contiguous(0, data.nbytes), new_spans)
            if not r.hit_sent and r.own_hit_tokens:  # the hit's part this node read (PE path: all of it)
                self._copy_pd(r, layer, own, layer_spans(eng.layout, a.pe_offsets, layer, 0, r.own_hit_tokens),
                              layer_spans(eng.layout, a.de_offsets, layer, 0, r.own_hit_tokens))
            if r.pe_path and r.cached + n < len(r.prompt):
                # a later chunk reloads this chunk's KV from the PE buffer (checked when it loads)
                r.pending_pd += 1
                eng.copy(data, contiguous(0, data.nbytes), own, layer_spans(eng.layout, a.pe_offsets, layer, r.cached, r.cached + n),
                         _post(eng, CopyDone(a.rid, CopyKind.PD, layer)))

    def _copy_pd(self, r: PrefillRequest, layer: int, src: np.ndarray, src_spans: list, dst_spans: list) -> None:
        """A checked copy into the DE's buffer (spans from its start, engine/peers.py); its sums join
        the request's `pd_sums` for the DE."""
        r.pending_pd += 1
        msg, a, eng = CopyDone(r.assign.rid, CopyKind.PD, layer), r.assign, self._engine
        eng.timeline.begin(("pd", a.rid))  # ended by the engine's CopyDone handling when none is pending
        region = ShmRegion(a.de_segment, 0, max(off + n for off, n in dst_spans))
        r.pd_sums += eng.peers.write(a.de_endpoint, a.de_data, src, src_spans, region, dst_spans,
                                     lambda _sums: eng.mail.to_self(msg))


def _post(engine: EngineBase, msg: object) -> Callable[[object], None]:
    """A copy's completion callback (on the arbiter's thread): post `msg` to the engine's inbox."""
    return lambda _result: engine.mail.to_self(msg)
