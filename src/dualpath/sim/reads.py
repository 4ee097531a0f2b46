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
With a DRAM tier (`+dram`, dram.py) a read takes from its node's DRAM what the tier holds when it
joins the queue (at memory speed, taken as free beside the SNIC) and reads only the rest from
storage: the queue counts those tokens. A read whose tier holds all of it skips the queue and takes
no buffer room: the PE's layer loads and the DE path's streams read the blocks from the tier's own
host memory, and the request takes its DE-buffer room before its first forward, as one with no hit
(a local request, +selective, still takes its DE's room here). Copying such a hit into the buffer
at its read instead filled the DE buffers with prompts waiting for a PE, and left dualpath+dram
slower than dualpath where PE compute binds (DS 660B 2P4D at 64K; tests/sim/test_dram.py holds the
difference on a small case). The model never evicts a block between a read's start and its use.
Whatever a read read is then in the node's tier.
A split read (`dualpath+split`, core/policy/split.py) is two such reads at once, each a `ReadPart`:
the hit's prefix on the PE node (its bytes in the PE buffer) and the suffix on the DE node (the
whole prompt's room in the DE buffer, as the DE path); the request is ready when both are done.
"""

from __future__ import annotations

from ..core.lanes import Lane
from ..core.phase import Phase
from ..core.snapshot import ReadSide
from .lifecycle import SimContext, TurnLifecycle
from .links import Flow
from .state import Node, ReadPart, SimRequest


class StorageReads:
    def __init__(self, ctx: SimContext, life: TurnLifecycle) -> None:
        self.ctx = ctx
        self.life = life
        self.bytes_by_side = [0.0, 0.0]  # read from storage, indexed by ReadSide
        self.dram_bytes_by_side = [0.0, 0.0]  # taken from a node's DRAM tier instead (`+dram`)
        self.num_split = 0  # requests whose hit was read on both sides (`dualpath+split`)

    def enqueue(self, req: SimRequest, node: Node) -> None:
        req.to(Phase.READING)
        pe_part = req.pe_part_tokens
        if pe_part:  # a split read: the DE node's suffix first, then the PE node's prefix
            assert req.pe is not None and req.de is not None
            self.num_split += 1
            self._queue(ReadPart(req, ReadSide.DECODE, pe_part, req.hit_tokens - pe_part, req.de.node))
            self._queue(ReadPart(req, ReadSide.PREFILL, 0, pe_part, req.pe.node))
        else:
            self._queue(ReadPart(req, req.side, 0, req.hit_tokens, node))

    def _queue(self, part: ReadPart) -> None:
        node = part.node
        req = part.req
        req.read_parts.append(part)
        part.storage_tokens -= node.dram.held_tokens(req.rid.agent, part.first, part.first + part.tokens, True)
        if not part.storage_tokens and (not req.local or self._reserve(part)):  # all in the node's DRAM
            self._started(part)
            self.ctx.loop.call_at(part.start_s, self._landed, part)
            return
        node.read_queue.append(part)
        node.read_queue_tokens += part.storage_tokens
        self.pump(node)

    def _started(self, part: ReadPart) -> None:
        req = part.req
        part.start_s = self.ctx.loop.now_s
        if req.t_read_start < 0 or not req.pe_part_tokens:  # a split read: its first part's start
            req.t_read_start = part.start_s

    def pump(self, node: Node) -> None:
        ctx = self.ctx
        limit = ctx.cfg.cluster.reads_in_flight_per_node
        while node.read_queue and node.reads_active < limit:
            part = node.read_queue[0]
            if not self._reserve(part):
                return
            node.read_queue.popleft()
            node.reads_active += 1
            self._started(part)
            latency_s = ctx.cfg.cluster.storage_read_latency_s
            if latency_s > 0:  # the reader waits for the store's first byte, then the bytes flow
                ctx.loop.call_at(ctx.loop.now_s + latency_s, self._start_flow, part)
            else:
                self._start_flow(part)

    def _start_flow(self, part: ReadPart) -> None:
        ctx = self.ctx
        node = part.node
        if not part.storage_tokens:  # all in DRAM, queued only for its buffer room
            ctx.loop.call_at(ctx.loop.now_s, self._ended, part)
            return
        nbytes = part.storage_tokens * ctx.kv_bytes_per_token
        links = (node.snic_in,) if ctx.storage_egress is None else (ctx.storage_egress, node.snic_in)
        ctx.net.start(nbytes, Lane.KV, links, self._done, part)

    def _reserve(self, part: ReadPart) -> bool:
        ctx = self.ctx
        req = part.req
        if req.pe_buffer_bytes if part.side is ReadSide.PREFILL else req.de_buffer_bytes:
            return True  # placement took it (ClusterConfig.buffers_at_placement)
        if part.side is ReadSide.PREFILL:  # its PE's node, or a local request's relay (+selective)
            node, nbytes = req.pe_side_node, part.tokens * ctx.kv_bytes_per_token
        else:  # the whole prompt's room: the PE's KV joins it (a local prefill's too, +selective)
            de = req.chosen_de
            node, nbytes = de.node, req.input_tokens * ctx.kv_bytes_per_token
        if not node.reserve(nbytes):
            node.waiters[id(node)] = node  # the reader is this node: a release here pumps it again
            return False
        if part.side is ReadSide.PREFILL:
            req.pe_buffer_bytes = float(nbytes)
        else:
            req.de_buffer_bytes = float(nbytes)
        return True

    def _done(self, flow: Flow) -> None:
        self._ended(flow.tag)

    def _ended(self, part: ReadPart) -> None:
        """A read its node's reader ran ends."""
        node = part.node
        node.reads_active -= 1
        node.read_queue_tokens -= part.storage_tokens
        self._landed(part)
        self.pump(node)

    def _landed(self, part: ReadPart) -> None:
        req, node = part.req, part.node
        ctx = self.ctx
        kvb = ctx.kv_bytes_per_token
        self.bytes_by_side[part.side] += part.storage_tokens * kvb
        self.dram_bytes_by_side[part.side] += (part.tokens - part.storage_tokens) * kvb
        node.dram.fill(req.rid.agent, part.first, part.first + part.tokens)
        req.read_parts.remove(part)
        ctx.timeline.span(node.read_track, "read", part.start_s, ctx.loop.now_s, req.rid)
        if part.side is ReadSide.DECODE:
            req.delivered_bytes += part.tokens * kvb  # hit KV now sits in the DE buffer
        if not req.read_parts:  # the whole hit is in (both parts of a split read)
            req.t_read_end = ctx.loop.now_s
            self.life.prefill_ready(req)
