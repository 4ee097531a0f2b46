"""A decode engine group (one node, GPUs in lockstep) running continuous batching.

Numbered path of one request on the DE side (docs/paper.md §1.3 steps 8-9 / 6-7, §1.4):
  1. `kv_landed` (simulator): the full prompt KV is in the DE buffer; it is copied into the DE's HBM
     (loopback on the DE's CNIC, KV lane), then the buffer space is freed.
  2. `join`: the request enters the running batch; it needs gen_tokens - 1 steps (the first token
     came from prefill). With `decode_waits_for_step_end` (the `local` preset, as the runtime's DE)
     the H2D of step 1 starts, and the join happens, when the running step ends (`after_step`):
     the step's phase is the fractional part of `progress_steps`, which restarts when a request
     joins an idle group.
  3. Progress is fluid between membership changes: with step time t fixed while the batch is
     unchanged, the group advances 1/t steps per second; each join or leave re-derives t from the
     batch (per GPU: attention compute- or memory-bound; shared: weights or linear FLOPs). The
     `local` preset's measured steps also slow down while the engines copy KV (cpu_share.py), and a
     join costs its measured extra time once (`decode_join_s`).
  4. `_on_finish`: the request leaves; the simulator persists its new full blocks and starts the
     agent's next turn. With `+dram` and timed persists (the `local` preset) each generated block
     enters the node's DRAM tier when the step that filled it ends (`block_filled`), as the
     runtime's DE copies it there, not with the others at the turn's end.
A request prefilled here (`+selective`, core/policy/local.py) first rides the steps as chunks
(`prefill`): its uncached tokens in ceil(n / local_prefill_max_tokens) steps, each step longer by
its share of `chunk_in_decode_s` (compute.py) for as long as it prefills; a group with no decoding
request steps for the chunks alone. When its last chunk's step ends, `local_prefill_done` gives its
first token and it joins the batch (`join_now`). The chunks' EP bytes are not booked on the CNICs.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Callable

from ..core.phase import Phase
from .ep_comm import ep_comm_for
from .events import PRIO_COMPLETE
from .lifecycle import SimContext, TurnLifecycle
from .state import Engine, Node, SimRequest

_EPS_STEPS = 1e-9


class DecodeGroup:
    def __init__(self, ctx: SimContext, life: TurnLifecycle, node: Node) -> None:
        self.ctx = ctx
        self.life = life
        self.node = node
        n = len(node.engines)
        self.attn_s = [0.0] * n  # per GPU: sum of attention compute seconds per step
        self.kv_bytes = [0.0] * n  # per GPU: KV bytes read per step
        self.num_running = 0
        self.progress_steps = 0.0
        self.updated_s = 0.0
        self.step_s = 0.0
        self.version = 0
        self._heap: list[tuple[float, int, SimRequest, int, float, float]] = []
        # local prefills (+selective): (progress at their last chunk's end, seq, request, seconds added per step)
        self._prefills: list[tuple[float, int, SimRequest, float]] = []
        self.prefill_step_s = 0.0  # what the local prefills add to every step now
        # `+dram` with timed persists (persists.py): (progress when a step fills a generated block, seq,
        # request, block index), each handed to the node's DRAM tier when its step ends
        self._fills: list[tuple[float, int, SimRequest, int]] = []
        self._takes_blocks = (ctx.features.dram_tier and ctx.cfg.cluster.persist_waits_for_snic_write
                              and ctx.io.persists_take_time())  # PersistWrites' `timed`, with a tier
        self.num_local_prefills = 0
        self._seq = 0
        self.busy_s = 0.0
        self.num_steps = 0.0
        self.seq_steps = 0.0  # running sequences summed over steps (fidelity's mean decode batch)
        self._padded = ctx.compute.decode_pads_to_longest()
        self._waits_for_step_end = ctx.cfg.cluster.decode_waits_for_step_end
        self.running_per_gpu = [0] * n
        self._compute_step_s = self._ep_extra_s = 0.0  # step_s = the two (when self.ep is not None)
        self.ep = ep_comm_for(ctx.cfg, ctx.net, node, prefill=False)  # None: no EP bytes on the CNICs
        if self.ep is not None:
            self.ep.watch(self._links_changed)
        self._io_factor = 1.0  # 1 + the measured slowdown while the engines copy KV (cpu_share.py)
        self._io_links: tuple = ()
        if ctx.cpu.slows_decode():  # the engines' CNICs, each once
            self._io_links = tuple({id(e.cnic_out): e.cnic_out for e in node.engines}.values())
            for link in self._io_links:
                link.watchers.append(self._io_changed)
        # measured: the step in which a request joins takes this much longer (its first step's own work)
        self._join_s = ctx.cfg.local.decode_join_s if ctx.cfg.local is not None else 0.0
        self._steps = ctx.timeline.steps([e.track for e in node.engines], "decode")  # a span per step, per GPU
        self._step_args = self._batch_args  # bound once: `_advance` hands it over without a new object
        self._on_event_cb: Callable[[int], None] = self._on_event  # bound once: `_reschedule` runs per event

    def _advance(self) -> None:
        now = self.ctx.loop.now_s
        step_s = self.step_s
        if (self.num_running or self._prefills) and step_s > 0:
            dt = now - self.updated_s
            steps = dt / step_s
            p0 = self.progress_steps
            self.progress_steps = p0 + steps
            self._steps.advance(self.updated_s, now, p0, self.progress_steps, step_s, self._step_args)
            self.num_steps += steps
            self.seq_steps += steps * self.num_running
            self.busy_s += dt
        self.updated_s = now

    def _batch_args(self) -> list[dict]:
        """Per GPU, the running requests (the timeline's `decode` args, metrics/timeline.py)."""
        rids: list[list] = [[] for _ in self.running_per_gpu]
        for entry in self._heap:
            rids[entry[3]].append(entry[2].rid)
        return [{"batch": len(r), "requests": r} for r in rids]

    def _restep(self) -> None:
        cm = self.ctx.compute
        if not self.num_running:
            self.step_s = cm.prefill_only_step_s() + self.prefill_step_s if self._prefills else 0.0
            if self.ep is not None:
                self.ep.reserve(None, 0.0)
            return
        if self._padded:
            self.step_s = self._padded_step_s() * self._io_factor + self.prefill_step_s
            return
        worst = cm.max_gpu_attention_s(self.attn_s, self.kv_bytes)
        step_s = cm.decode_step_s(worst, self.num_running) + self.prefill_step_s
        ep = self.ep
        if ep is not None:  # the EP bursts' time under the KV now on the GPUs' CNICs
            self._compute_step_s = step_s
            extra = ep.extra_s(self.running_per_gpu)
            self._ep_extra_s = extra
            step_s += extra
            self.step_s = step_s
            ep.reserve(self.running_per_gpu, step_s)
        else:
            self.step_s = step_s

    def _links_changed(self, gpu: int) -> None:
        """A flow started or ended on one of the GPU's CNIC directions: re-time the step (ep_comm.py)."""
        ep = self.ep
        if ep is None or not self.num_running or self._padded:
            return
        extra = ep.gpu_changed(gpu, self.running_per_gpu[gpu])
        if extra == self._ep_extra_s:
            return
        self._advance()
        self._ep_extra_s = extra
        self.step_s = self._compute_step_s + extra
        ep.reserve(self.running_per_gpu, self.step_s)
        self._reschedule()

    def _io_changed(self) -> None:
        """A flow started or ended on an engine's CNIC: re-time the step when the engines' KV copies
        started or stopped (cpu_share.py)."""
        busy = any(link.flows[0] or link.flows[1] for link in self._io_links)
        factor = 1.0 + self.ctx.cpu.decode_io_slowdown if busy else 1.0
        if factor == self._io_factor:
            return
        self._advance()
        self._io_factor = factor
        if self.num_running or self._prefills:
            self._restep()
            self._reschedule()

    def _padded_step_s(self) -> float:
        """The slowest GPU's step when each pads its batch to its longest context (a request's
        `attn` entry then holds its context, compute_measured.py): O(running), used only by the
        measured `local` preset, whose decode batches are a handful of sequences."""
        count = [0] * len(self.attn_s)
        longest = [0.0] * len(self.attn_s)
        for entry in self._heap:
            i, ctx = entry[3], entry[4]
            count[i] += 1
            if ctx > longest[i]:
                longest[i] = ctx
        cm = self.ctx.compute
        return max(cm.padded_decode_step_s(n, c) for n, c in zip(count, longest) if n)

    def _reschedule(self) -> None:
        version = self.version + 1
        self.version = version
        heap, pre = self._heap, self._prefills
        if heap:
            target = heap[0][0]
            if pre and pre[0][0] < target:
                target = pre[0][0]
            fills = self._fills
            if fills and fills[0][0] < target:
                target = fills[0][0]
        elif pre:
            target = pre[0][0]
        else:
            return
        wait = (target - self.progress_steps) * self.step_s
        if not wait > 0.0:  # max(0.0, wait)
            wait = 0.0
        loop = self.ctx.loop
        loop.call_at(loop.now_s + wait, self._on_event_cb, version, PRIO_COMPLETE)

    def after_step(self, fn: Callable[[Any], None], arg: Any) -> None:
        """`fn(arg)` when the running step ends; at once when no step runs or the group does not
        wait for step ends (the paper presets' fluid decode)."""
        self._advance()
        if not self._waits_for_step_end or not (self.num_running or self._prefills) or self.step_s <= 0:
            fn(arg)
            return
        left_steps = math.ceil(self.progress_steps) - self.progress_steps
        self.ctx.loop.call_at(self.ctx.loop.now_s + left_steps * self.step_s, fn, arg)

    def join(self, req: SimRequest, eng: Engine) -> None:
        self.after_step(self._join_now, (req, eng))

    def join_now(self, req: SimRequest, eng: Engine) -> None:
        """Join at once: a local prefill's last step has just ended (`local_prefill_done`)."""
        self._join_now((req, eng))

    def prefill(self, req: SimRequest) -> None:
        """Prefill `req` here (+selective): its hit is in its DE's HBM; its uncached tokens ride
        the steps from the next one (`after_step`)."""
        self.after_step(self._prefill_now, req)

    def _prefill_now(self, req: SimRequest) -> None:
        self._advance()
        if not self.num_running and not self._prefills:  # an idle group's first step starts now
            self.progress_steps = float(math.ceil(self.progress_steps))
        n = max(1, req.remaining_tokens)
        steps = -(-n // self.ctx.cfg.scheduler.local_prefill_max_tokens)  # a step carries at most this many
        cost_s = self.ctx.compute.chunk_in_decode_s(req.hit_tokens, n) / steps
        self.prefill_step_s += cost_s
        self.num_local_prefills += 1
        req.t_prefill_start = self.ctx.loop.now_s
        req.to(Phase.PREFILLING)
        self._seq += 1
        heapq.heappush(self._prefills, (self.progress_steps + steps, self._seq, req, cost_s))
        self._restep()
        self._reschedule()

    def _join_now(self, req_eng: tuple[SimRequest, Engine]) -> None:
        req, eng = req_eng
        self._advance()
        if not self.num_running and not self._prefills:  # an idle group's first step starts now
            self.progress_steps = float(math.ceil(self.progress_steps))
        steps = req.gen_tokens - 1
        ctx = req.input_tokens + req.gen_tokens / 2  # mean context over the decode (fluid model)
        attn, kvb = self.ctx.compute.decode_request_cost(ctx)
        i = eng.index
        self.attn_s[i] += attn
        self.kv_bytes[i] += kvb
        self.num_running += 1
        self.running_per_gpu[i] += 1
        if self.ep is not None:  # every step's bursts at once: the ledger is exact once the request ends
            self.ep.book_one(i, steps)
        self._seq += 1
        p0 = self.progress_steps
        heapq.heappush(self._heap, (p0 + steps, self._seq, req, i, attn, kvb))
        if self._takes_blocks:  # token j comes from step j: block k-1 fills with token j = k * b - input
            b, n_in = self.ctx.cfg.cluster.block_tokens, req.input_tokens
            for k in range(n_in // b + 1, (n_in + req.gen_tokens - 1) // b + 1):
                self._seq += 1
                heapq.heappush(self._fills, (p0 + (k * b - n_in), self._seq, req, k - 1))
        self._restep()
        if self._join_s > 0:  # every running request waits the joining step's extra time
            self.progress_steps -= self._join_s / self.step_s
        req.t_second = self.ctx.loop.now_s + self.step_s + self._join_s
        self._reschedule()

    def _on_event(self, version: int) -> None:
        if version != self.version:
            return
        self._advance()
        done: list[SimRequest] = []
        heap = self._heap
        reached = self.progress_steps + _EPS_STEPS
        attn_s, kv_bytes, running = self.attn_s, self.kv_bytes, self.running_per_gpu
        fills = self._fills
        while fills and fills[0][0] <= reached:  # before the requests that end now: their blocks fill first
            _, _, freq, index = heapq.heappop(fills)
            self.life.block_filled(freq, index)
        while heap and heap[0][0] <= reached:
            _, _, req, i, attn, kvb = heapq.heappop(heap)
            attn_s[i] -= attn
            kv_bytes[i] -= kvb
            running[i] -= 1
            done.append(req)
        self.num_running -= len(done)
        if not self.num_running:  # drop float residue
            self.attn_s = [0.0] * len(self.attn_s)
            self.kv_bytes = [0.0] * len(self.kv_bytes)
        prefilled: list[SimRequest] = []
        pre = self._prefills
        while pre and pre[0][0] <= reached:
            _, _, preq, cost_s = heapq.heappop(pre)
            self.prefill_step_s -= cost_s
            prefilled.append(preq)
        if not pre:
            self.prefill_step_s = 0.0  # drop float residue
        self._restep()
        self._reschedule()
        for req in done:
            self.life.decode_finished(req)
        for req in prefilled:
            self.life.local_prefill_done(req)
