"""Storage reads (docs/paper.md §1.3 steps 1-2): hit KV as Full Blocks, storage -> SNIC -> host buffer.

Numbered path of one read:
  1. `enqueue`: the request joins its read-side node's FIFO read queue; the node's read queue
     (tokens, the policy's read_q) grows by its hit.
  2. `pump`: the head starts when fewer than `reads_in_flight_per_node` reads run and its buffer
     reservation succeeds (PE side: the hit in the PE buffer; DE side: the whole prompt in the DE
     buffer, since the miss KV will join it there), unless placement took it (persists.py). A head
     that cannot reserve waits, and registers itself on the full node so that a release there
     pumps this queue again.
  3. After the store's latency (ClusterConfig.storage_read_latency_s, 0 by default), the flow
     crosses [storage egress (if finite), SNIC in] on the KV lane.
  4. `_done`: the read queue shrinks, the request is PREFILL_READY in its PE's batch queue.
"""

from __future__ import annotations

from ..core.lanes import Lane
from ..core.phase import Phase
from ..core.snapshot import ReadSide
from .lifecycle import SimContext, TurnLifecycle
from .links import Flow
from .state import Node, SimRequest


class StorageReads:
    def __init__(self, ctx: SimContext, life: TurnLifecycle) -> None:
        self.ctx = ctx
        self.life = life
        self.bytes_by_side = [0.0, 0.0]  # indexed by ReadSide

    def enqueue(self, req: SimRequest, node: Node) -> None:
        req.to(Phase.READING)
        node.read_queue.append(req)
        node.read_queue_tokens += req.hit_tokens
        self.pump(node)

    def pump(self, node: Node) -> None:
        ctx = self.ctx
        limit = ctx.cfg.cluster.reads_in_flight_per_node
        while node.read_queue and node.reads_active < limit:
            req = node.read_queue[0]
            if not self._reserve(req):
                return
            node.read_queue.popleft()
            node.reads_active += 1
            req.t_read_start = ctx.loop.now_s
            latency_s = ctx.cfg.cluster.storage_read_latency_s
            if latency_s > 0:  # the reader waits for the store's first byte, then the bytes flow
                ctx.loop.call_at(ctx.loop.now_s + latency_s, self._start_flow, (req, node))
            else:
                self._start_flow((req, node))

    def _start_flow(self, tag: tuple[SimRequest, Node]) -> None:
        req, node = tag
        ctx = self.ctx
        nbytes = req.hit_tokens * ctx.kv_bytes_per_token
        links = (node.snic_in,) if ctx.storage_egress is None else (ctx.storage_egress, node.snic_in)
        ctx.net.start(nbytes, Lane.KV, links, self._done, tag)

    def _reserve(self, req: SimRequest) -> bool:
        ctx = self.ctx
        pe, de = req.pe, req.de
        assert pe is not None and de is not None
        if req.pe_buffer_bytes if req.side is ReadSide.PREFILL else req.de_buffer_bytes:
            return True  # placement took it (ClusterConfig.buffers_at_placement)
        if req.side is ReadSide.PREFILL:
            node, nbytes = pe.node, req.hit_tokens * ctx.kv_bytes_per_token
        else:
            node, nbytes = de.node, req.input_tokens * ctx.kv_bytes_per_token
        if not node.reserve(nbytes):
            node.waiters[id(node)] = node  # the reader is this node: a release here pumps it again
            return False
        if req.side is ReadSide.PREFILL:
            req.pe_buffer_bytes = float(nbytes)
        else:
            req.de_buffer_bytes = float(nbytes)
        return True

    def _done(self, flow: Flow) -> None:
        req: SimRequest
        node: Node
        req, node = flow.tag
        ctx = self.ctx
        node.reads_active -= 1
        node.read_queue_tokens -= req.hit_tokens
        self.bytes_by_side[req.side] += flow.size_bytes
        req.t_read_end = ctx.loop.now_s
        ctx.timeline.span(node.read_track, "read", req.t_read_start, req.t_read_end, req.rid)
        if req.side is ReadSide.DECODE:
            req.delivered_bytes += flow.size_bytes  # hit KV now sits in the DE buffer
        self.life.prefill_ready(req)
        self.pump(node)
