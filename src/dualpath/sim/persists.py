"""Persists that take time, and placement that waits for them, as the runtime does (so
`dualpath fidelity` scores the simulator on the runtime's own mechanism).

Two parts, both switched on by `ClusterConfig.persist_waits_for_snic_write` (the `local` preset;
off, a queued block counts as written at once and nothing waits, the paper presets' model):

`PersistWrites`: the blocks a DE queues (hits.py names them) go to storage through its node's
SNIC, as `runtime/engine/decode.py:_persist_full_blocks` and `EngineBase._write_loop` send them:
  1. the D2H copy out of HBM, one flow per block on the DE's CNIC arbiter (with
     `cnic_as_runtime_arbiter`), as the DE copies each block on its own;
  2. one writer per DE node takes the blocks in order, each through the SNIC's write bucket
     (`EngineBase.snic_write`: `TokenBucket(snic_bytes_per_s, burst = one full block)`): the
     first block of an idle writer goes at once, each later one when its bytes are paid for;
  3. `written`: the block counts as stored (`Persisted` -> `Placement.persisted`), and the
     placement gate looks again. The store's own write time (a local file, ~ms) is not modelled.
A turn's generated blocks are queued as each fills, as the runtime's DE does after every step
(`submit_generated`, at the turn's end): block k is ready when the step that computes the KV of its
last position ends, at that token's time on the line from the second token to the last
(`filled_at_s`); the writer takes it then or when it is free, so the write may have ended before
the turn's end. Their D2H flow is booked at the turn's end and nothing waits on it.

`PlacementGate`: `Router._place` / `_try_place`. Requests the pass assigned wait in one FIFO; the
head whose next prompt block is still being written (`HitModel.blocked_by_persist`) holds the
queue until the write ends or `persist_wait_s` passes, then goes on with what is stored. The hit
is what is stored at placement (`Placement.hit_tokens`, larger or smaller than the decision's);
a recomputed hit does not wait. The request's read tokens stay charged to its read side while it
waits, as the router charges the decision's. With `ClusterConfig.buffers_at_placement` (the
`local` preset) the head then takes its host-buffer room as `Placement.allocate_regions` does: one
Full Block slot per prompt block in the DE node's buffer, and on the PE read path as many in the PE
node's, all or nothing; lacking room it holds the queue until a release there (`Simulator.
release_buffer` pumps the gate). Without it, reads.py and prefill.py reserve when they first use
a buffer (the paper presets).
"""

from __future__ import annotations

from collections import deque
from typing import Callable

from ..core.snapshot import ReadSide
from ..metrics.timeline import ROUTER, SIDES
from .events import PRIO_SCHEDULE
from .hits import HitModel
from .lifecycle import SimContext, TurnLifecycle
from .links import Flow, Link
from .reads import StorageReads
from .state import Engine, Node, SimRequest


class _Writer:
    __slots__ = ("level_bytes", "stamp_s", "free_at_s")

    def __init__(self, burst_bytes: float) -> None:
        self.level_bytes = burst_bytes  # the runtime's bucket starts full
        self.stamp_s = 0.0
        self.free_at_s = 0.0  # when the writer thread takes its next block


class PersistWrites:
    def __init__(self, ctx: SimContext, hits: HitModel, on_written: Callable[[], None]) -> None:
        cl = ctx.cfg.cluster
        self.ctx = ctx
        self.hits = hits
        self.on_written = on_written
        self.modelled = cl.persist_waits_for_snic_write  # the `local` preset; else a persist is only booked
        self.timed = self.modelled and ctx.io.persists_take_time()
        # `+dram` with timed persists (the `local` preset, compared with the runtime): the DE node's tier
        # took each generated block when the decode step that filled it ended (sim/decode.py
        # `block_filled`, the same condition), as the runtime's DE copies it there, not at the turn's end
        self._tier_took_them = ctx.features.dram_tier and self.timed
        assert hits.instant_writes != self.timed, "the hit model and the writer disagree on whether writes take time"
        self.copies_on_de_cnic = cl.cnic_as_runtime_arbiter  # a block's copy out of HBM crosses the DE's arbiter
        self.block_bytes = float(cl.block_tokens * ctx.kv_bytes_per_token)
        self.rate_bytes_per_s = cl.node.snic_bytes_per_s
        self._writers: dict[int, _Writer] = {}  # by DE node id
        self.persisted_bytes = 0.0
        self.num_written = 0  # blocks whose write ended (timed only)

    def submit(self, keys: list[int], de: Engine) -> None:
        if not keys:
            return
        de.node.dram.fill_keys(keys)  # the blocks sit in the DE node's buffer (`+dram`, dram.py)
        ctx = self.ctx
        d2h = self._d2h_link(de)
        if self.timed and d2h is not None:  # one D2H copy per block, each block written after its own
            for k in keys:
                self.persisted_bytes += ctx.io.persist(de.node.snic_out, self.block_bytes, d2h, self._copied, ([k], de))
            return
        self.persisted_bytes += ctx.io.persist(de.node.snic_out, len(keys) * self.block_bytes, d2h)
        if not self.timed:  # stored at once: each block's span takes no time
            self.hits.stored_now(keys)
            span, track, now = ctx.timeline.span, de.node.write_track, ctx.loop.now_s
            for _ in keys:
                span(track, "persist", now, now)
        else:
            self._write(keys, de.node)

    def submit_generated(self, keys: list[int], de: Engine, req: SimRequest) -> None:
        """The turn's blocks at its end: the generated ones (the last `len(filled)`) as they filled."""
        if not self.timed:
            self.submit(keys, de)
            return
        filled = filled_at_s(req, self.ctx.cfg.cluster.block_tokens)
        num_prompt = len(keys) - len(filled)
        if not filled:
            self.submit(keys, de)
            return
        assert num_prompt >= 0, (len(keys), len(filled))
        self.submit(keys[:num_prompt], de)  # a one-token turn's prompt blocks (StoreHits)
        gen = keys[num_prompt:]
        if not self._tier_took_them:
            de.node.dram.fill_keys(gen)
        self.persisted_bytes += self.ctx.io.persist(de.node.snic_out, len(gen) * self.block_bytes, self._d2h_link(de),
                                                    self._copied_out, de)
        self._write(gen, de.node, filled)

    def _d2h_link(self, de: Engine) -> Link | None:
        """The link a block's copy out of HBM crosses: the DE's CNIC arbiter, in the `local` preset."""
        return de.cnic_out if self.copies_on_de_cnic else None

    def _copied(self, flow: Flow) -> None:
        keys, de = flow.tag
        self._copied_out(flow, de)
        self._write(keys, de.node, queued_s=flow.start_s)

    def _copied_out(self, flow: Flow, de: Engine | None = None) -> None:
        """A D2H copy out of the DE's HBM ended: its `d2h` span on the DE's CNIC track (as the runtime's)."""
        de = flow.tag if de is None else de
        self.ctx.timeline.span(de.cnic_track, "d2h", flow.start_s, self.ctx.loop.now_s)

    def _write(self, keys: list[int], node: Node, ready_s: list[float] | None = None, queued_s: float | None = None) -> None:
        """The writer takes `keys` when ready (now, or each at `ready_s`); `queued_s`: when they were
        queued, if before (a D2H copy came between), for the timeline's `persist` spans."""
        loop = self.ctx.loop
        w = self._writers.get(node.nid)
        if w is None:
            w = self._writers[node.nid] = _Writer(self.block_bytes)
        rate = self.rate_bytes_per_s
        for i, k in enumerate(keys):
            ready = loop.now_s if ready_s is None else ready_s[i]
            start = max(ready, w.free_at_s)
            level = min(self.block_bytes, w.level_bytes + rate * (start - w.stamp_s)) - self.block_bytes
            w.level_bytes, w.stamp_s = level, start
            w.free_at_s = start + (-level / rate if level < 0 else 0.0)
            loop.call_at(max(loop.now_s, w.free_at_s), self._written, k)
            wait_s = start - (ready if queued_s is None else queued_s)
            self.ctx.timeline.span(node.write_track, "persist", start, w.free_at_s, None, {"wait_s": wait_s})

    def _written(self, key: int) -> None:
        self.num_written += 1
        self.hits.written(key)
        self.on_written()


def filled_at_s(req: SimRequest, block_tokens: int) -> list[float]:
    """When each generated block of a finished turn had KV at every position (the runtime's rule:
    a token's KV is computed by the step that emits the next one, so the last token's is not).
    Generated token j (0: the prefill's, at t_first) is emitted at t_second + (j - 1) / (gen - 2)
    of the way to t_finish: a line, where the sim's decode rate changes with its batch."""
    b, n_in, gen = block_tokens, req.input_tokens, req.gen_tokens
    out = []
    for k in range(n_in // b + 1, (n_in + gen - 1) // b + 1):  # blocks [n_in // b, (n_in + gen - 1) // b)
        j = k * b - n_in  # the token whose step computes the KV of the block's last position (k * b - 1)
        out.append(req.t_finish if gen <= 2 else req.t_second + (j - 1) / (gen - 2) * (req.t_finish - req.t_second))
    return out


class _Placing:
    __slots__ = ("req", "node", "recompute", "since_s", "gave_up", "buffer_waited")

    def __init__(self, req: SimRequest, node: Node, recompute: bool) -> None:
        self.req = req
        self.node = node  # the read side's node
        self.recompute = recompute
        self.since_s = -1.0  # when it began to wait for a persist
        self.gave_up = False  # it waited persist_wait_s and goes on with what is stored
        self.buffer_waited = False  # it found a buffer without room for its prompt


class PlacementGate:
    def __init__(self, ctx: SimContext, hits: HitModel, life: TurnLifecycle, reads: StorageReads) -> None:
        cl = ctx.cfg.cluster
        self.ctx = ctx
        self.hits = hits
        self.life = life
        self.reads = reads
        self.waits = cl.persist_waits_for_snic_write and ctx.io.persists_take_time()
        self.wait_s = cl.persist_wait_s
        self.holds_buffers = cl.buffers_at_placement and ctx.io.reserves_buffers()
        self.block_tokens = cl.block_tokens
        self.slot_bytes = float(cl.block_tokens * ctx.kv_bytes_per_token)  # one Full Block (HostBuffer slot)
        self._fifo: deque[_Placing] = deque()
        self.num_waited = 0  # requests that waited for a persist
        self.num_gave_up = 0  # of those, requests that went on after persist_wait_s
        self.num_buffer_waits = 0  # requests placement held for buffer room

    def admit(self, req: SimRequest, read_node: Node, recompute: bool) -> None:
        if not self.waits and not self.holds_buffers:
            self._place(req, read_node)
            return
        p = _Placing(req, read_node, recompute)
        for node, tokens in _charges(p):
            node.read_queue_tokens += tokens
        self._fifo.append(p)
        self.pump()

    def pump(self) -> None:
        loop = self.ctx.loop
        while self._fifo:
            p = self._fifo[0]
            if self.waits and not p.recompute and self.hits.blocked_by_persist(p.req):
                if p.since_s < 0:
                    p.since_s = loop.now_s
                    self.num_waited += 1
                    loop.call_at(loop.now_s + self.wait_s, self._timeout, None, PRIO_SCHEDULE)
                if loop.now_s < p.since_s + self.wait_s:
                    return
                if not p.gave_up:
                    p.gave_up = True
                    self.num_gave_up += 1
            req = p.req
            hit = req.hit_tokens if p.recompute else self.hits.stored_hit_tokens(req)  # a persist may have landed
            if self.holds_buffers and not self._take_buffers(req, min(req.pe_part_tokens, hit)):
                if not p.buffer_waited:
                    p.buffer_waited = True
                    self.num_buffer_waits += 1
                return
            self._fifo.popleft()
            for node, tokens in _charges(p):
                node.read_queue_tokens -= tokens
            if not p.recompute:
                req.set_hit(hit)
                req.pe_part_tokens = min(req.pe_part_tokens, hit)  # a split's PE part, shorter if the hit is
            self._place(req, p.node)

    def _timeout(self, _: object) -> None:
        self.pump()

    def _take_buffers(self, req: SimRequest, pe_part_tokens: int) -> bool:
        """The prompt's slots in the DE node's buffer and, on the PE path, the PE node's (a split
        read: its PE part's, `pe_part_tokens`), as the runtime's `Placement.allocate_regions`; or
        none and the gate waits on the buffer that lacked room."""
        assert req.de is not None
        nbytes = -(-req.input_tokens // self.block_tokens) * self.slot_bytes
        de_node = req.de.node
        pe_bytes = nbytes if req.side is ReadSide.PREFILL else -(-pe_part_tokens // self.block_tokens) * self.slot_bytes
        if not de_node.reserve(nbytes):
            de_node.waiters[id(self)] = self
            return False
        if pe_bytes:
            pe_node = req.pe_side_node
            if not pe_node.reserve(pe_bytes):
                de_node.buffer_free_bytes += nbytes  # all or nothing (nobody waits on what was never held)
                pe_node.waiters[id(self)] = self
                return False
            req.pe_buffer_bytes = pe_bytes
        req.de_buffer_bytes = nbytes
        return True

    def _place(self, req: SimRequest, read_node: Node) -> None:
        self.ctx.timeline.instant(ROUTER, "placed", self.ctx.loop.now_s, req.rid,
                                  {"hit_tokens": req.hit_tokens, "side": SIDES[req.side]})
        if self.ctx.io.tokens_to_read(req) == 0:  # nothing to read, a free network, or recomputed
            self.life.prefill_ready(req)
        else:
            self.reads.enqueue(req, read_node)

    def charged(self) -> list[tuple[Node, int]]:
        """(node, hit tokens) charged to a node's read queue by each request waiting here: its hit to
        the read side's node; a split read's PE part to the PE node and the rest to the DE node's."""
        return [c for p in self._fifo for c in _charges(p)]


def _charges(p: _Placing) -> list[tuple[Node, int]]:
    """What a request waiting for placement charges to the read queues (the runtime's `Bookings.hit_found`)."""
    req = p.req
    pe_part = req.pe_part_tokens
    if not pe_part:
        return [(p.node, req.hit_tokens)]
    assert req.pe is not None
    return [(req.pe.node, pe_part), (p.node, req.hit_tokens - pe_part)]
