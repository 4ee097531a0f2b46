"""The simulator: a modelled PD-disaggregated cluster driven by the shared core policy.

Numbered path of one agent turn (docs/structure.md; module docstrings hold the details):
  1. `_start_turn`: the turn's request (context + append, generate g) joins the global queue.
  2. `Dispatch` (dispatch.py) runs `core.scheduler.GlobalScheduler`'s pass: PE by Algorithm 1,
     DE in two phases, `resolve_hit` (the agent's durable prefix), the read side.
  3. `StorageReads` (reads.py): hit KV storage -> SNIC -> host buffer of the read side.
  4. `prefill_ready` -> `PrefillGroup` (prefill.py): layerwise prefill with quota batching;
     `prefill_computed` emits the first token.
  5. `kv_landed`: the prompt KV is whole in the DE buffer -> H2D into DE HBM -> `DecodeGroup.join`
     (decode.py; `after_step`: both when the DE's step ends, with `decode_waits_for_step_end`).
  6. `decode_finished`: metrics, persist the new full blocks through the DE node's SNIC, start the
     agent's next turn, after its tool time (`TurnSpec.wait_s`; zero in the paper's replay, §4.2).
A request prefilled on its DE (`+selective`, core/policy/local.py) skips the PE: 2 chooses only its
DE, 3 reads on the DE's node (or a relay PE node's), then `_prefill_on_de` copies the hit into the
DE's HBM and the DE prefills the rest in its steps (decode.py); `local_prefill_done` is its first
token, then 5's join.
The hit model (hits.py, chosen by the workload) answers 2 and names the blocks persisted at 5 and
6; persists.py writes them and, between 2 and 3, holds placement while a hit block is written.

Determinism: no wall clock, no global counters, no unseeded randomness; ties follow events.py.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Sequence

import numpy as np

from ..config import Features, SimConfig
from ..core.lanes import Lane
from ..core.phase import Phase
from ..core.policy import PrefillThresholds, RecomputeRule
from ..core.scheduler import derive_thresholds
from ..core.snapshot import EngineLoad, QueuedRequest
from ..errors import InputError
from ..metrics import NULL_TIMELINE, Timeline, TurnRecorder
from .compute_measured import compute_for
from .cpu_share import cpu_share_for
from .decode import DecodeGroup
from .dispatch import Dispatch
from .events import PRIO_ARRIVAL, PRIO_SAMPLE, PRIO_SCHEDULE, EventLoop
from .hits import hit_model_for
from .links import Flow, Link, Network
from .kv_io import kv_io_for
from .persists import PersistWrites, PlacementGate
from .lifecycle import SimContext, TurnLifecycle
from .prefill import PrefillGroup
from .reads import StorageReads
from .bound import BoundWatch, RunBound
from .results import build_result
from .state import Agent, Engine, Node, SimRequest

_TOL_BYTES = 1.0


class Simulator(TurnLifecycle):
    def __init__(self, cfg: SimConfig, features: Features, trajectories: Sequence[Any], arrivals_s: Sequence[float], timeline: Timeline = NULL_TIMELINE) -> None:
        if len(trajectories) != len(arrivals_s):
            raise InputError("need one arrival time per trajectory")
        self.cfg = cfg
        self.features = features
        cl = cfg.cluster
        self.model = cl.model_spec
        self.kv_bytes_per_token = self.model.kv_bytes_per_token
        self.block_tokens = cl.block_tokens
        self.loop = EventLoop()
        self.net = Network(self.loop)
        weights = cfg.scheduler.lane_weights
        self._weights = weights
        self.compute, self.pe_kv_hbm_bytes, self.de_kv_hbm_bytes = compute_for(cfg)  # the paper's or measured
        egress = cl.storage_egress_bytes_per_s
        self.storage_egress: Link | None = Link("storage_egress", egress, weights) if egress else None
        self._build_topology()
        self.io = kv_io_for(features.io_free, self.net, self.kv_bytes_per_token)  # the mode's network, once
        self.ctx = ctx = SimContext(self.loop, self.net, self.compute, features, cfg, self.kv_bytes_per_token,
                                    self.pe_kv_hbm_bytes, self.storage_egress, self.io, timeline, cpu_share_for(cfg))
        self.reads = StorageReads(ctx, self)
        self.prefill_groups = {n.nid: PrefillGroup(ctx, self, n) for n in self.prefill_nodes}
        self.decode_groups = {n.nid: DecodeGroup(ctx, self, n) for n in self.decode_nodes}
        self.agents = [Agent(i, tuple(t.turns), float(a)) for i, (t, a) in enumerate(zip(trajectories, arrivals_s))]
        self.hits = hit_model_for(trajectories, self.block_tokens, cl.persist_waits_for_snic_write,  # the workload's, once
                                  not (cl.persist_waits_for_snic_write and self.io.persists_take_time()))
        if features.dram_tier:  # each node's host-DRAM tier (`+dram`, dram.py), GB = 1e9 bytes
            for n in self.nodes:
                n.dram = self.hits.dram_tier(int(cl.dram_tier_gb_per_node * 1e9), self.block_tokens * self.kv_bytes_per_token)
        self._validate_fit()
        self.inflight: dict = {}
        self.num_recomputed, thresholds = 0, self._profile_thresholds()  # hits computed again, not read
        self.gate = PlacementGate(ctx, self.hits, self, self.reads)  # placement waits for persists (persists.py)
        self.writes = PersistWrites(ctx, self.hits, self.gate.pump)
        self.driver = Dispatch(ctx, self, self.reads, self.nodes, self.engines_by_id, thresholds, self.gate,
                               self._recompute_rule())
        self.recorder = TurnRecorder()
        self.num_agents_done = 0
        self._kick_pending: set[int] = set()
        self.snic_samples: list[list[float]] = []
        self.h2d_bytes = 0.0

    # --- construction ----------------------------------------------------------------------
    def _build_topology(self) -> None:
        cl = self.cfg.cluster
        ns = cl.node
        w = self._weights
        self.nodes: list[Node] = []
        self.engines_by_id: dict[int, Engine] = {}
        self.links: list[Link] = [self.storage_egress] if self.storage_egress else []
        for nid in range(cl.num_prefill_nodes + cl.num_decode_nodes):
            is_pe = nid < cl.num_prefill_nodes
            read_bytes_per_s = ns.snic_read_bytes_per_s * (cl.prefill_snic_scale if is_pe else 1.0)  # 1.0: the paper's
            node = Node(nid, is_pe, Link(f"snic_in{nid}", read_bytes_per_s, w), Link(f"snic_out{nid}", ns.snic_bytes_per_s, w), ns.dram_buffer_bytes)
            self.links += [node.snic_in, node.snic_out]
            hbm = self.pe_kv_hbm_bytes if is_pe else self.de_kv_hbm_bytes
            for g in range(ns.gpus_per_node):
                eid = nid * ns.gpus_per_node + g
                out, inn = ((Link(f"cnic{eid}", ns.cnic_bytes_per_s, w, cl.cnic_kv_flood, True),) * 2  # one FIFO link (config.py)
                            if cl.cnic_as_runtime_arbiter else
                            [Link(f"cnic_{d}{eid}", ns.cnic_bytes_per_s, w, cl.cnic_kv_flood) for d in ("out", "in")])
                self.links += dict.fromkeys((out, inn))
                eng = Engine(eid, node, g, hbm, out, inn, eid - (0 if is_pe else cl.num_prefill_nodes * ns.gpus_per_node))
                node.engines.append(eng)
                self.engines_by_id[eid] = eng
            self.nodes.append(node)
        self.prefill_nodes = [n for n in self.nodes if n.is_prefill]
        self.decode_nodes = [n for n in self.nodes if not n.is_prefill]

    def _validate_fit(self) -> None:
        for a in self.agents:
            if not a.turns or a.turns[0].append_tokens < 1:
                raise InputError(f"agent {a.aid}: the first round must send at least one token")
        longest = max((sum(t.append_tokens + t.gen_tokens for t in a.turns) for a in self.agents), default=0)
        need = longest * self.kv_bytes_per_token
        if need > self.de_kv_hbm_bytes:
            raise InputError(
                f"the longest trajectory ({longest} tokens, {need / 1e9:.1f} GB of KV) does not fit one DE's free HBM "
                f"({self.de_kv_hbm_bytes / 1e9:.1f} GB); lower --max-len or use a bigger GPU"
            )
        if need > self.cfg.cluster.node.dram_buffer_bytes:
            raise InputError("the longest trajectory's KV does not fit a node's DRAM buffer")

    def _profile_thresholds(self) -> PrefillThresholds:
        """alpha and beta "profiled in advance" (docs/paper.md §3.2): alpha from the SNIC rate; beta from
        the compute model on the workload's mean turn, in batches the compute quota allows."""
        sched = self.cfg.scheduler
        snic = self.cfg.cluster.node.snic_read_bytes_per_s
        prompts, misses = [], []
        for a in self.agents:
            ctx = 0
            for t in a.turns:
                prompts.append(ctx + t.append_tokens)
                misses.append(min(ctx + t.append_tokens, t.append_tokens + self.block_tokens // 2))
                ctx += t.append_tokens + t.gen_tokens
        prompt = max(1, int(np.mean(prompts))) if prompts else 1
        miss = max(1, min(prompt, int(np.mean(misses)))) if misses else 1
        per_req_attn = self.compute.attention_time_s(prompt - miss, miss)
        batch = max(1, int(sched.compute_quota_s // per_req_attn)) if per_req_attn > 0 else 1
        self.prefill_tokens_per_s = self.compute.prefill_tokens_per_s_per_gpu(prompt, miss, batch)
        # the SNIC rate even for the oracle: its read queues stay empty, so alpha decides nothing
        th = derive_thresholds(sched.alpha_read_s, sched.beta_compute_s, snic, self.kv_bytes_per_token,
                               self.prefill_tokens_per_s)
        self.profile = {"alpha_tokens": th.alpha_tokens, "beta_tokens": int(sched.beta_compute_s * self.prefill_tokens_per_s),
                        "profile_prompt_tokens": prompt, "profile_miss_tokens": miss, "profile_batch_requests_per_gpu": batch}
        return th

    def _recompute_rule(self) -> RecomputeRule | None:
        """Read or recompute when configured: a node's read rate, a PE's prompt tokens/s (as beta's)."""
        if not self.cfg.scheduler.recompute_when_faster:
            return None
        return RecomputeRule(self.kv_bytes_per_token, self.cfg.cluster.node.snic_read_bytes_per_s, self.prefill_tokens_per_s)

    # --- 1. turns ----------------------------------------------------------------------------
    def _arrive(self, agent: Agent) -> None:
        self._start_turn(agent)

    def _start_turn(self, agent: Agent) -> None:
        turn = agent.turns[agent.next_turn]
        inp = agent.context_tokens + turn.append_tokens
        hbm = (inp + turn.gen_tokens) * self.kv_bytes_per_token
        req = SimRequest(agent, agent.next_turn, inp, turn.gen_tokens, hbm, self.loop.now_s)
        if self.features.local_prefill:  # +selective decides on the uncached tokens it expects now
            req.qview = QueuedRequest(req.rid, inp, hbm, inp + turn.gen_tokens, inp - self.hits.hit_tokens(req))
        self.inflight[req.rid] = req
        self.driver.submit(req)

    # --- 2. hit ------------------------------------------------------------------------------
    def resolve_hit(self, req: SimRequest) -> None:
        """The hit model's answer (hits.py): trajectories, the agent's earlier context as the paper's
        client computes it; a Mooncake trace, the longest stored prefix of the prompt's blocks."""
        req.set_hit(self.hits.hit_tokens(req))

    def recompute_hit(self, req: SimRequest) -> None:
        """The scheduler chose to compute the hit again (core/policy/recompute.py): a miss."""
        req.set_hit(0)
        self.num_recomputed += 1

    # --- 4. prefill --------------------------------------------------------------------------
    def prefill_ready(self, req: SimRequest) -> None:
        req.to(Phase.PREFILL_READY)
        if req.t_read_end < 0:
            req.t_read_end = self.loop.now_s
        if req.local:
            self._prefill_on_de(req)
            return
        pe = req.pe
        assert pe is not None
        pe.batch_queue.append(req)
        self.kick_prefill(pe.node.nid)

    def kick_prefill(self, node_id: int) -> None:
        """Coalesce: all requests that become ready at one instant share the next forward. A group
        whose compute runs past this instant gets no event (it would find the group busy); the
        forward's end kicks it."""
        nid = node_id
        group = self.prefill_groups[nid]
        if nid not in self._kick_pending and not group.busy_past_now():
            self._kick_pending.add(nid)
            self.loop.call_at(self.loop.now_s, self._kicked, group, PRIO_SCHEDULE)

    def _kicked(self, group: PrefillGroup) -> None:
        self._kick_pending.discard(group.node.nid)
        group.try_start()

    def prefill_computed(self, req: SimRequest) -> None:
        req.computed = True
        req.t_first = self.loop.now_s
        pe = req.pe
        assert pe is not None
        pe.release(req.input_tokens)
        self.driver.pe_released(pe.node)
        if req.pe_buffer_bytes:
            self.release_buffer(pe.node, req.pe_buffer_bytes)
            req.pe_buffer_bytes = 0.0
        self.driver.kick()
        if req.pending_pd == 0:
            self.kv_landed(req)

    def _prefill_on_de(self, req: SimRequest) -> None:
        """+selective: the hit, read into the DE buffer, is copied into the DE's HBM (over its CNIC,
        as the PE path's prompt is); read on a relay PE node, it crosses that node's CNIC (the GPU of
        the DE's rank) into the DE's; then the DE prefills the rest (decode.py `prefill`)."""
        de = req.chosen_de
        nbytes = req.hit_tokens * self.kv_bytes_per_token
        relay = req.relay
        links: tuple[Link, ...]
        if relay is None:
            links = (de.cnic_out, de.cnic_in)
        else:  # the relay GPU's CNIC, then the DE's; one FIFO link (the `local` preset's arbiter): the relay's write
            out = relay.engines[de.index % len(relay.engines)].cnic_out
            links = (out,) if out.fifo else (out, de.cnic_in)
        if nbytes and self.io.to_decode_hbm(req, nbytes, links, self._local_h2d_done):
            if relay is None:
                self.h2d_bytes += nbytes
            return
        self._local_buffers_free(req)
        self.decode_groups[de.node.nid].prefill(req)

    def _local_h2d_done(self, flow: Flow) -> None:
        req: SimRequest = flow.tag
        track = req.chosen_de.cnic_track
        self.ctx.timeline.span(track, "h2d" if req.relay is None else "transfer", flow.start_s, self.loop.now_s, req.rid)
        self._local_buffers_free(req)
        self.decode_groups[req.chosen_de.node.nid].prefill(req)

    def _local_buffers_free(self, req: SimRequest) -> None:
        self._release_de_buffer(req)
        if req.pe_buffer_bytes:  # the relay node's
            self.release_buffer(req.pe_side_node, req.pe_buffer_bytes)
            req.pe_buffer_bytes = 0.0

    def local_prefill_done(self, req: SimRequest) -> None:
        """The DE's step with the request's last chunk ended: its first token; it decodes there."""
        req.computed = True
        req.t_first = self.loop.now_s
        if req.gen_tokens == 1:
            req.t_second = req.t_first
            self._finish(req)
            return
        self._join(req, at_once=True)

    # --- 5. to decode ------------------------------------------------------------------------
    def kv_landed(self, req: SimRequest) -> None:
        req.to(Phase.KV_TO_DECODE)
        expect = req.input_tokens * self.kv_bytes_per_token
        if abs(req.delivered_bytes - expect) > _TOL_BYTES:
            raise AssertionError(f"{req.rid}: {req.delivered_bytes} prompt KV bytes reached the DE, expected {expect}")
        if req.gen_tokens == 1:
            self._release_de_buffer(req)
            req.t_second = req.t_first
            self._finish(req)
            return
        self.decode_groups[req.chosen_de.node.nid].after_step(self._to_hbm, req)  # the DE's loop sees it

    def _to_hbm(self, req: SimRequest) -> None:
        expect, de = req.input_tokens * self.kv_bytes_per_token, req.chosen_de
        if self.io.to_decode_hbm(req, expect, (de.cnic_out, de.cnic_in), self._h2d_done):
            self.h2d_bytes += expect
        else:  # a free network: the KV is in HBM now
            self._join(req)

    def _h2d_done(self, flow: Flow) -> None:
        self.ctx.timeline.span(flow.tag.chosen_de.cnic_track, "h2d", flow.start_s, self.loop.now_s, flow.tag.rid)
        if self.gate.holds_buffers:  # `local`: its blocks are queued for persist before its buffer frees, as the runtime's DE
            self._join(flow.tag)
            self._release_de_buffer(flow.tag)
        else:
            self._release_de_buffer(flow.tag)
            self._join(flow.tag)

    def _join(self, req: SimRequest, at_once: bool = False) -> None:
        """Into the DE's batch: when its step ends, or `at_once` (a local prefill's last step just ended)."""
        req.to(Phase.DECODING)
        de = req.chosen_de
        self.writes.submit(self.hits.prompt_in_cache(req), de)
        group = self.decode_groups[de.node.nid]
        if at_once:
            group.join_now(req, de)
        else:
            group.join(req, de)

    def _release_de_buffer(self, req: SimRequest) -> None:
        if req.de_buffer_bytes:
            assert req.de is not None
            self.release_buffer(req.de.node, req.de_buffer_bytes)
            req.de_buffer_bytes = 0.0

    def release_buffer(self, node: Node, nbytes: float) -> None:
        node.buffer_free_bytes += nbytes
        if node.waiters:
            waiters = list(node.waiters.values())
            node.waiters.clear()
            for w in waiters:
                if isinstance(w, Node):
                    self.reads.pump(w)
                elif w is self.gate:  # placement's head waits for room (buffers_at_placement)
                    self.gate.pump()
                else:
                    self.kick_prefill(w.node.nid)

    # --- 6. finish ---------------------------------------------------------------------------
    def decode_finished(self, req: SimRequest) -> None:
        self._finish(req)

    def block_filled(self, req: SimRequest, index: int) -> None:
        """Into its DE node's DRAM tier, as the runtime's DE copies it out of HBM (`+dram` with timed
        persists: decode.py); a block no later turn can name is not kept."""
        key, de = self.hits.generated_key(req, index), req.de
        assert de is not None, "a block filled on no DE"
        if key >= 0:
            de.node.dram.fill_keys([key])

    def _finish(self, req: SimRequest) -> None:
        now = self.loop.now_s
        req.to(Phase.FINISHED)
        req.t_finish = now
        pe, de = req.pe, req.de  # pe None: prefilled on its DE (+selective)
        assert de is not None
        de.release(req.de_len_tokens, req.hbm_bytes)
        self.driver.de_released(de.node)
        del self.inflight[req.rid]
        self.recorder.record(
            req.rid.agent, req.rid.turn, req.t_arrival, req.t_pe, req.t_de, req.t_read_end, req.t_prefill_start, req.t_first,
            req.t_second, now, req.gen_tokens, req.input_tokens, req.hit_tokens, int(req.side), -1 if pe is None else pe.eid, de.eid,
        )
        agent = req.agent
        agent.context_tokens = req.input_tokens + req.gen_tokens
        self.writes.submit_generated(self.hits.turn_finished(req), de, req)
        agent.next_turn += 1
        if agent.next_turn < len(agent.turns):
            wait_s = agent.turns[agent.next_turn].wait_s
            if wait_s > 0.0:  # the agent runs its tool first
                self.loop.call_at(now + wait_s, self._arrive, agent, PRIO_ARRIVAL)
            else:
                self._start_turn(agent)
        else:
            agent.finish_s = now
            self.num_agents_done += 1
            if self.num_agents_done == len(self.agents):
                self.loop.halt()

    # --- sampling and run ----------------------------------------------------------------------
    def _sample(self, _: object) -> None:
        row = []
        for n in self.nodes:
            self.net.settle(n.snic_in)
            row.append(n.snic_in.served_bytes[Lane.KV])
        self.snic_samples.append(row)
        if self.num_agents_done < len(self.agents):
            nxt = self.loop.now_s + self.cfg.metrics.balance_window_s
            horizon = self.cfg.workload.horizon_s
            if horizon is None or nxt <= horizon:
                self.loop.call_at(nxt, self._sample, None, PRIO_SAMPLE)

    def run(self, progress: Any = None, bound: RunBound | None = None) -> dict[str, Any]:
        """Run until every agent finishes, or until the workload's horizon (online runs); with a
        `bound` (bound.py, offline only), stop earlier once the run cannot come first.

        The workload and the cluster, built before, live as long as the run: they leave the cyclic
        garbage collector's sight for it (`gc.freeze`). A 48P96D run's 49,152 agents hold millions of
        objects that every full collection walked again: a third of its samples under `perf record`.
        And the collector stays off while it runs: the run's objects die by their reference counts
        (a collection after a 512-agent 2P4D run finds a few hundred in cycles;
        tests/sim/test_simulator.py bounds it), and the collections of what it allocates were still
        5-9% of a 48P96D run's time."""
        t0 = time.perf_counter()
        gc.collect()
        gc.freeze()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._run(progress, t0, bound)
        finally:
            if was_enabled:
                gc.enable()
            gc.unfreeze()

    def _run(self, progress: Any, t0: float, bound: RunBound | None = None) -> dict[str, Any]:
        for agent in self.agents:
            self.loop.call_at(agent.arrival_s, self._arrive, agent, PRIO_ARRIVAL)
        self.loop.call_at(0.0, self._sample, None, PRIO_SAMPLE)
        horizon = self.cfg.workload.horizon_s
        until = float("inf") if horizon is None else horizon
        every = self.cfg.check_invariants_every
        total = len(self.agents)
        step = every or 20000
        chunked = bool(every or progress is not None or bound is not None)
        if bound is not None and (horizon is not None or self.cfg.workload.warmup_s):
            raise ValueError("a run bound is for a run to its last agent, with no horizon and no warm-up")
        watch = None if bound is None else BoundWatch(bound, self.recorder, self.agents)
        while self.loop.pending and self.num_agents_done < total and self.loop.now_s < until:
            before = self.loop.num_events
            if watch is not None:
                if self._run_watched(until, step, watch):
                    return watch.stopped_result(self.loop.now_s, time.perf_counter() - t0)
            elif chunked:
                self.loop.run(until_s=until, stop=_counter_stop(step))
            else:
                self.loop.run(until_s=until, stop_when_halted=True)  # halted when the last agent finishes
            if every:
                self.check_invariants()
            if progress is not None:
                progress(self.num_agents_done, total)
            if self.loop.num_events == before:
                break
        if horizon is None and self.num_agents_done < total:
            raise RuntimeError(f"simulation stalled: {self.num_agents_done}/{total} agents finished at t={self.loop.now_s:.1f}s")
        self._sample(None)
        self.check_invariants()
        return build_result(self, time.perf_counter() - t0)

    def _run_watched(self, until: float, step: int, watch: BoundWatch) -> bool:
        """One chunk of `step` events, as `_run` runs it, in 20 parts with the bound checked after
        each (bound.py): the same events in the same order, so a run that does not stop ends as an
        unbounded one does; True: stopped at the bound."""
        part = max(1, step // 20)
        left = step
        total = len(self.agents)
        while left > 0:
            n = min(part, left)
            before = self.loop.num_events
            self.loop.run(until_s=until, stop=_counter_stop(n))
            if self.num_agents_done < total and watch.passed(self.loop.now_s):
                return True
            if self.loop.num_events - before < n:  # the heap ran out (or the horizon): the chunk ends here too
                return False
            left -= n
        return False

    # --- ledgers -------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Conservation laws of every ledger (STYLE.md 8)."""
        tol = _TOL_BYTES * max(1, len(self.inflight))
        pe_buf = {n.nid: 0.0 for n in self.nodes}
        de_buf = dict(pe_buf)
        tok = {e: 0 for e in self.engines_by_id}
        seq = dict(tok)
        hbm = {e: 0.0 for e in self.engines_by_id}
        readq = dict(pe_buf)
        for req in self.inflight.values():
            if req.pe_buffer_bytes:  # its PE's node, or a local request's relay (+selective)
                pe_buf[req.pe_side_node.nid] += req.pe_buffer_bytes
            if req.pe is not None and not req.computed:
                tok[req.pe.eid] += req.input_tokens
                seq[req.pe.eid] += 1
            if req.de is not None:
                de_buf[req.de.node.nid] += req.de_buffer_bytes
                tok[req.de.eid] += req.de_len_tokens
                seq[req.de.eid] += 1
                hbm[req.de.eid] += req.hbm_bytes
            for part in req.read_parts:  # queued or running on its node (both parts of a split read)
                readq[part.node.nid] += part.storage_tokens
        for node, tokens in self.gate.charged():  # charged at the decision (persists.py)
            readq[node.nid] += tokens
        for n in self.nodes:
            used = n.buffer_total_bytes - n.buffer_free_bytes
            if abs(used - pe_buf[n.nid] - de_buf[n.nid]) > tol or n.buffer_free_bytes < -tol:
                raise AssertionError(f"node {n.nid}: buffer used {used} != reservations {pe_buf[n.nid] + de_buf[n.nid]}")
            if n.read_queue_tokens != readq[n.nid]:
                raise AssertionError(f"node {n.nid}: read queue {n.read_queue_tokens} != {readq[n.nid]} tokens")
            n.dram.check_invariants()
        for eid, e in self.engines_by_id.items():
            if e.load() != EngineLoad(eid, e.node.nid, e.num_seqs, e.num_tokens, int(e.hbm_free_bytes)):
                raise AssertionError(f"engine {eid}: cached load snapshot is stale")
            if e.num_tokens != tok[eid] or e.num_seqs != seq[eid]:
                raise AssertionError(f"engine {eid}: tok/seq {e.num_tokens}/{e.num_seqs} != {tok[eid]}/{seq[eid]}")
            if not e.node.is_prefill:
                if abs(e.hbm_total_bytes - e.hbm_free_bytes - hbm[eid]) > tol or e.hbm_free_bytes < -tol:
                    raise AssertionError(f"engine {eid}: HBM ledger off or overcommitted")
        self.driver.check_invariants()
        self.net.check_invariants(self.links)


def _counter_stop(step: int):
    count = [0]

    def stop() -> bool:
        count[0] += 1
        return count[0] >= step

    return stop

