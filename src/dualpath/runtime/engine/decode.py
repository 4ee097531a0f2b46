"""Decode engine process: DE buffer, the DE read path, continuous batching, persistence.

Numbered path of one request through a DE (protocol.py has the whole picture):
  1. `DecodeAssign`: the router has reserved KV-cache room (HBM) and a DE-buffer region. DE path
     with a hit: read the hit blocks into the region through this node's SNIC (a split read: the
     blocks after the PE's part), then `HitReady` to the PE (and `ReadDone` to the router).
  2. `LayerPull` (DE path): this engine's CNIC arbiter writes layer l of the cached tokens from
     the region into the PE's landing zone, then `LayerReady` to the PE.
  3. `PromptReady`: every prompt byte is in the region. Check it against the PE's checksums
     (transport/integrity.py); if any piece fails, recompute the prompt's KV here into the region
     (the PE's copies are gone), never use the damaged bytes. Copy it into the KV cache (H2D, through the
     arbiter), tell the router (`PromptLoaded`: the region is freed), persist the prompt's new
     full blocks, and join the running batch with the first token the PE sampled.
  4. Every decode step runs all running requests (continuous batching); each token goes to the
     router; a block that becomes full is copied out (D2H) and persisted through the SNIC. A
     request with n > 1 choices (OpenAI's `n`) runs one sequence per choice, each started from
     the loaded prompt by `PagedKVCache.fork` (the prompt's full blocks shared, not copied) with
     the first token the PE sampled for it; each choice's blocks persist under its own chain.
  5. At EOS (when allowed) or max_tokens: a choice ends; once every choice has ended and no copy
     touches its blocks, free the KV cache, `DecodeDone` to the router.
A request prefilled here (`DecodeAssign.local`, +selective) has no PE: after step 1's read (or at
once, with no hit) this engine computes the rest of the prompt into the region between two decode
steps, samples the first tokens as a PE would and sends `FirstToken` (local_prefill.py); step 3
follows without the transfer's checksums.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from ...core.blocks import block_digest
from ...core.measured import causal_keys
from ...core.snapshot import ReadSide
from ...metrics.timeline import DE_TO_PE
from .base import CopyKind, CopyDone, EngineBase, EngineSpec, ReadFinished
from .kv_region import contiguous, layer_spans
from .mid_step import StepInterleave
from ..model import PagedKVCache
from ..transport.integrity import bad_pieces
from ..api import MAX_CHOICES
from ..model.generate import SamplerParams, TokenSampler, choice_seed
from .local_prefill import prefill_into_region, usable_hit_tokens
from .logprobs import first_tokens, wire_logprobs
from ..protocol import (Cancel, EngineRole, DecodeAssign, DecodeDone, FirstToken, Hello, HitReady, LayerDropped, LayerPull, LayerReady,
                       PersistQueued, PromptLoaded, PromptReady, ReadDone, Token)
from ..transport import ShmRegion
from .stages import DECODE_MOVES, DecodeStage, moved

_SEED_STRIDE = 0x9E3779B1  # decode tokens use a seed derived from the request's, distinct from the PE's


def decode_seed(seed: int, choice: int) -> int:
    """The seed of the DE's sampler for choice `choice` of a request seeded `seed` (its first
    token was sampled on the PE with `choice_seed(seed, choice)`)."""
    return (choice_seed(seed, choice) * 2654435761 + _SEED_STRIDE) % (2**63)


def _decode_sampler(a: DecodeAssign, choice: int) -> TokenSampler:
    return TokenSampler(SamplerParams(a.temperature, a.top_p, decode_seed(a.seed, choice)))


@dataclass(slots=True)
class DecodeRequest:
    assign: DecodeAssign
    tokens: list = field(default_factory=list)  # prompt + generated
    generated: int = 0
    digests: list = field(default_factory=list)  # chained digests of the full blocks so far
    persisted_blocks: int = 0
    hit_tokens: int = 0  # the PE's hit (PromptReady), repeated to the router in PromptLoaded
    first_logprobs: list = field(default_factory=list)  # the first token's (PromptReady), repeated too
    hit_blocks: int = 0
    sampler: TokenSampler | None = None
    stage: DecodeStage = DecodeStage.WAITING  # stages.py
    cancelled: bool = False  # beside the stage: ends it when nothing in flight touches it
    pending_copies: int = 0  # H2D and D2H copies that still touch this request's cache blocks (on choice 0)
    more_first: list = field(default_factory=list)  # choices 1..n-1's [first token, logprobs] (PromptReady)
    # OpenAI's n: choice 0 is the request (in `reqs`, its cache sequence the rid); `others` are the
    # rest, each with its own sequence (`seq`) and a `head` pointing back at choice 0
    choice: int = 0
    seq: int = 0
    others: list = field(default_factory=list)
    head: "DecodeRequest | None" = None

    def move(self, stage: DecodeStage) -> None:
        self.stage = moved(DECODE_MOVES, self.stage, stage)

    def choices(self) -> list["DecodeRequest"]:
        return [self, *self.others]


_SERVED_MID_STEP = (LayerPull, ReadFinished, CopyDone)  # _serve_mid_step: what a step serves between its layers


class DecodeEngine(EngineBase):
    def __init__(self, spec: EngineSpec) -> None:
        super().__init__(spec)
        bt = self.cfg.block_tokens
        self.cache = PagedKVCache(self.mcfg, num_blocks=-(-self.cfg.engines.de_kv_tokens // bt), block_tokens=bt,
                                  dtype=self.dtype, device=self.device, workspace=self.cfg.engines.de_decode_workspace)
        self.cache_bytes = self.cache.kv.view(-1).view(torch.uint8)
        self.reqs: dict[int, DecodeRequest] = {}
        self.eos = set(self.mcfg.eos_token_ids)
        self.interleave = StepInterleave(lambda: self.mail.recv(0), self._serve_mid_step, self.handle)

    def run(self) -> None:
        # HBM in whole blocks: the router reserves prompt + max_tokens rounded up to blocks
        self.mail.to_router(Hello(self.spec.engine, EngineRole.DECODE, self.spec.endpoint, self.cache.num_blocks * self.cfg.block_tokens,
                             self.buffers[self.node].nbytes, 0.0, 0.0, *self.own_buffer()))
        while not self._stop:
            while True:
                msg = self.mail.recv(0)
                if msg is None:
                    break
                self.handle(msg)
            if self._running():
                self._step()
                self.maybe_report_counters()
            else:
                self.pump(lambda: self._stop or bool(self._running()), timeout_s=0.05)
        self.close()

    def handlers(self) -> dict:
        return {**super().handlers(), DecodeAssign: self._assign, ReadFinished: self._read_finished,
                LayerPull: self._when_assigned(self._layer_pull, ended=self._pull_of_ended),
                PromptReady: self._when_assigned(self._prompt_ready), HitReady: self._when_assigned(self._relay_ready),
                CopyDone: self._copy_done, Cancel: self._on_cancel}

    def _when_assigned(self, handler, ended=None):
        """A peer's message about a request whose assignment has not come yet waits for it (stash);
        one about a request already let go goes to `ended` (None: dropped)."""
        def handle(msg) -> None:
            if msg.rid in self.reqs:
                handler(msg)
            elif self.mail.has_ended(msg.rid):
                if ended is not None:
                    ended(msg)
            else:
                self.mail.hold(msg.rid, msg)
        return handle

    def _pull_of_ended(self, m: LayerPull) -> None:
        """A pull for a request cancelled here: the PE's forward waits for an answer (LayerDropped)."""
        self.mail.send(m.reply_to, LayerDropped(m.rid, m.layer))

    def _read_finished(self, msg: ReadFinished) -> None:
        r = self.reqs.get(msg.rid)
        if r is not None:
            r.move(DecodeStage.WAITING)
            a = r.assign
            self.mail.to_router(ReadDone(msg.rid, self.spec.engine, a.hit_tokens - a.pe_part_tokens, msg.nbytes, msg.ok_blocks))
            if r.cancelled:
                self._cancel(r)
            elif a.local:
                self._prefill_here(r, msg.ok_blocks)
            else:
                self.mail.send(r.assign.pe_endpoint, HitReady(msg.rid, msg.ok_blocks))

    def _on_cancel(self, msg: Cancel) -> None:
        r = self.reqs.get(msg.rid)
        if r is not None:
            r.cancelled = True
            self._cancel(r)

    def _serve_mid_step(self, msg) -> bool:
        """What a decode step serves between its layers (engine/mid_step.py), for a live request:
        - a layer pull: the DE path's stream must not wait for the step;
        - its finished read: HitReady starts the PE's pulls;
        - a finished copy: after the H2D the request joins the next step, not the one after.
        None runs the model (a `PromptReady` may recompute) or touches the step's sequences: the
        step's batch holds its own block indices, and a copy touches only its request's blocks."""
        r = self.reqs.get(msg.rid) if type(msg) in _SERVED_MID_STEP else None
        if r is not None and r.assign.local and type(msg) is ReadFinished:
            return False  # a local prefill follows the read: the model is the step's
        return r is not None and not r.cancelled

    def _cancel(self, r: DecodeRequest) -> None:
        """End a cancelled request now unless a read or copy still touches it (then when it ends:
        `_read_finished`, `_copy_done`); one already finishing ends as it would."""
        for c in r.others:
            if c.stage is DecodeStage.RUNNING:
                c.move(DecodeStage.FINISHING)
        if r.stage in (DecodeStage.WAITING, DecodeStage.RUNNING, DecodeStage.FINISHING):
            self._finish(r)

    # --- 1. assignment and the DE read path ---------------------------------------------------
    def _assign(self, a: DecodeAssign) -> None:
        r = DecodeRequest(a, tokens=list(a.prompt_ids), sampler=_decode_sampler(a, 0), seq=a.rid)
        self.reqs[a.rid] = r
        if a.read_side == ReadSide.DECODE and a.hit_tokens:  # the hit's blocks [first, nb): a split read's DE part
            first, nb = a.pe_part_tokens // self.cfg.block_tokens, a.hit_tokens // self.cfg.block_tokens
            r.stage = DecodeStage.READING  # its first stage
            self.storage.read_blocks(a.rid, a.hit_digests[first:nb], self.node, a.de_offsets[first:nb])
        elif a.local and not a.hit_tokens:  # nothing to read: prefill it now (a relayed hit: at HitReady)
            self._prefill_here(r, 0)
        self.replay_held(a.rid)

    def _relay_ready(self, m: HitReady) -> None:
        """A PE node relayed the hit into the region (+selective, engine/relay.py): checked against
        the sums of its write; a damaged piece and the whole prompt is computed here."""
        r = self.reqs[m.rid]
        if r.cancelled:
            return
        self._prefill_here(r, 0 if m.ok_blocks and self._damaged(m.sums) else m.ok_blocks)

    def _prefill_here(self, r: DecodeRequest, ok_blocks: int) -> None:
        """+selective: the prompt after its checked hit computed here, the first tokens sampled as a
        PE samples them, `FirstToken` to the router, then step 3 (local_prefill.py)."""
        a = r.assign
        hit = usable_hit_tokens(a, ok_blocks, self.cfg.block_tokens)
        t0, span_s = time.perf_counter(), self.timeline.now_s()
        logits = prefill_into_region(self, a, hit)
        model_s = time.perf_counter() - t0
        self.counters.busy_s += model_s
        n = len(a.prompt_ids) - hit  # the PE's span args (fidelity/calibration.py reads them)
        self.timeline.until_now(self.track, "prefill", span_s, None,
                                lambda: {"requests": [a.rid], "tokens": n, "keys": causal_keys(n, hit), "model_s": model_s})
        eos = tuple(self.mcfg.eos_token_ids) if a.min_tokens > 0 or a.ignore_eos else None
        (token, logprobs), *more = first_tokens(logits, a.n, a.temperature, a.top_p, a.seed, a.logprobs, eos)
        self.mail.to_router(FirstToken(a.rid, token, hit, logprobs, more))
        self._load_prompt(r, token, hit, logprobs, more)

    # --- 2. layer streams to the PE -----------------------------------------------------------
    def _layer_pull(self, m: LayerPull) -> None:
        r, tb = self.reqs[m.rid], self.layout.kv_bytes_per_token_per_layer
        spans = layer_spans(self.layout, r.assign.de_offsets, m.layer, m.first_token, m.num_tokens)
        region = ShmRegion(m.segment, m.offset_bytes, m.num_tokens * tb)
        dst_spans = contiguous(m.first_token * tb, (m.num_tokens - m.first_token) * tb)  # sums from the region's start
        rid, layer = m.rid, m.layer
        self.timeline.begin(("stream", rid))
        self.peers.write(m.reply_to, m.reply_data, self.buffers[self.node], spans, region, dst_spans,
                         lambda _sums: self._layer_sent(rid, layer), reply=lambda sums: LayerReady(rid, layer, sums))

    def _layer_sent(self, rid: int, layer: int) -> None:
        """A pulled layer's bytes are sent (the link's thread); the last layer's end the stream's span."""
        if layer == self.mcfg.num_layers - 1:
            self.timeline.end(("stream", rid), self.cnic_track, "transfer", rid, DE_TO_PE)

    # --- 3. prompt into the KV cache ------------------------------------------------------------
    def _prompt_ready(self, m: PromptReady) -> None:
        r = self.reqs.get(m.rid)
        if r is None or r.cancelled:
            return
        if self._damaged(m.pd_sums):  # the PE's copies are gone: the prompt's KV from its tokens, here
            prefill_into_region(self, r.assign, 0)
        self._load_prompt(r, m.first_token, m.hit_tokens, m.logprobs, m.more)

    def _damaged(self, sums: list) -> bool:
        """Whether a piece another engine wrote into this node's buffer fails its sum (counted)."""
        bad = bad_pieces(self.buffers[self.node], sums)
        if bad:
            self.counters.pd_checksum_failures += len(bad)
            self.counters.kv_recomputes += 1
        return bool(bad)

    def _load_prompt(self, r: DecodeRequest, first_token: int, hit_tokens: int, logprobs: list, more: list) -> None:
        """The prompt's KV, whole in the region, into the KV cache (H2D); the first tokens kept."""
        bt = self.cfg.block_tokens
        r.hit_tokens, r.hit_blocks = hit_tokens, hit_tokens // bt
        r.tokens.append(first_token)
        r.first_logprobs, r.more_first = logprobs, more
        r.generated = 1
        n = len(r.assign.prompt_ids)
        self.cache.add_sequence(r.seq, n)
        fbb = self.layout.full_block_bytes
        table = self.cache.block_table(r.seq)
        src_spans = [(off, fbb) for off in r.assign.de_offsets]
        dst_spans = [(b * fbb, fbb) for b in table]
        rid = r.assign.rid
        r.move(DecodeStage.LOADING)
        r.pending_copies += 1
        self.timeline.begin(("h2d", rid))
        self.copy(self.buffers[self.node], src_spans, self.cache_bytes, dst_spans, lambda _res: self._h2d_copied(rid))

    def _h2d_copied(self, rid: int) -> None:
        """The prompt is in the KV cache (on the link's thread): the `h2d` span ends, the loop is told."""
        self.timeline.end(("h2d", rid), self.cnic_track, "h2d", rid)
        self.mail.to_self(CopyDone(rid, CopyKind.H2D, None))

    def _copy_done(self, m: CopyDone) -> None:
        r = self.reqs.get(m.rid)
        if r is None:
            return
        r.pending_copies -= 1
        if m.kind == CopyKind.H2D:
            if not r.cancelled:
                self._persist_full_blocks(r)  # announced before PromptLoaded (a 1-token request ends there)
            self.mail.to_router(PromptLoaded(m.rid, r.tokens[len(r.assign.prompt_ids)], r.hit_tokens, r.first_logprobs,
                                             r.more_first))
            if r.cancelled:
                self._finish(r)
                return
            self._fork_choices(r)
            for c in r.choices():
                if self._done(c, c.tokens[-1]):
                    self._finish(c)
                else:
                    c.move(DecodeStage.RUNNING)
        elif r.stage is DecodeStage.FINISHING:
            self._finish(r)

    def _fork_choices(self, r: DecodeRequest) -> None:
        """Choices 1..n-1 of a request whose prompt is in the cache: each a sequence forked from
        choice 0's (the prompt's full blocks shared), with the first token the PE sampled for it
        and the prompt's block digests (persisted once, by choice 0)."""
        prompt = r.tokens[: len(r.assign.prompt_ids)]
        for c, (token, _) in enumerate(r.more_first, start=1):
            seq = -(r.assign.rid * MAX_CHOICES + c)  # the router's rids are positive: no clash
            self.cache.fork(r.seq, seq)
            r.others.append(DecodeRequest(r.assign, tokens=[*prompt, token], generated=1, digests=list(r.digests),
                                          persisted_blocks=r.persisted_blocks, hit_tokens=r.hit_tokens,
                                          hit_blocks=r.hit_blocks, sampler=_decode_sampler(r.assign, c),
                                          stage=DecodeStage.LOADING, choice=c, seq=seq, head=r))

    # --- 4. decode ------------------------------------------------------------------------------
    def _step(self) -> None:
        running = self._running()[: self.cfg.engines.max_decode_batch]
        # only a request that has not joined the batch yet can be pulled from or read for
        waiting = len(running) < sum(len(r.choices()) for r in self.reqs.values()) and self.cfg.engines.de_serves_mid_step
        longest = max((self.cache.num_tokens(r.seq) for r in running), default=0)
        t0, served0, step_s = time.perf_counter(), self.interleave.serve_s, self.timeline.now_s()
        logits = self.model.decode_step(self.cache, [r.seq for r in running], [r.tokens[-1] for r in running],
                                        self.interleave.poll if waiting else None)
        model_s = time.perf_counter() - t0 - (self.interleave.serve_s - served0)  # model time alone
        self.counters.busy_s += model_s
        self.counters.forwards += 1
        self.counters.forward_items += len(running)
        self.counters.fit_items += len(running)  # the profile fit's terms (protocol.py: Counters.fit_terms)
        self.counters.fit_ctx += longest
        self.counters.fit_keys += len(running) * longest
        for r, raw in zip(running, logits):
            row = raw  # the logprobs' are the raw logits (engine/logprobs.py)
            if r.generated < r.assign.min_tokens or r.assign.ignore_eos:
                row = row.clone()
                row[list(self.eos)] = float("-inf")
            tok = r.sampler(row)
            r.tokens.append(tok)
            idx = r.generated
            r.generated += 1
            done = self._done(r, tok)
            reason = ("length" if r.generated >= r.assign.max_tokens else "stop") if done else ""
            self._persist_full_blocks(r)  # announced before the token (PersistQueued)
            self.mail.to_router(Token(r.assign.rid, tok, idx, done, reason, wire_logprobs(raw, tok, r.assign.logprobs),
                                      r.choice))
            if done:
                self._finish(r)
        self.timeline.until_now(self.track, "decode", step_s, None,  # ctx, model_s: fidelity/calibration.py
                                lambda: {"batch": len(running), "ctx": longest, "model_s": model_s,
                                         "requests": [r.assign.rid for r in running]})
        self.counters.served_mid_step += self.interleave.drain()

    def _running(self) -> list[DecodeRequest]:
        return [c for r in self.reqs.values() for c in r.choices() if c.stage is DecodeStage.RUNNING]

    def _done(self, r: DecodeRequest, last: int) -> bool:
        if r.generated >= r.assign.max_tokens:
            return True
        eos_allowed = not r.assign.ignore_eos and r.generated >= max(1, r.assign.min_tokens)
        return eos_allowed and last in self.eos

    def _persist_full_blocks(self, r: DecodeRequest) -> None:
        """Persist blocks whose every position has KV in the cache (docs/paper.md §1.4): prompt blocks
        beyond the hit, then each generated block as it fills. The hit blocks are already stored."""
        bt = self.cfg.block_tokens
        have = self.cache.num_tokens(r.seq) // bt
        while len(r.digests) < have:
            b = len(r.digests)
            parent = r.digests[-1] if r.digests else r.assign.root_digest
            r.digests.append(block_digest(parent, r.tokens[b * bt : (b + 1) * bt]))
        table = self.cache.block_table(r.seq)
        fbb = self.layout.full_block_bytes
        queued = r.digests[max(r.persisted_blocks, r.hit_blocks):have]
        if queued:
            self.mail.to_router(PersistQueued(self.spec.engine, queued))
        queued_s = self.timeline.now_s()  # the persist spans' wait counts from the announcement
        while r.persisted_blocks < have:
            b = r.persisted_blocks
            r.persisted_blocks += 1
            if b < r.hit_blocks:
                continue
            staging = np.empty(fbb, dtype=np.uint8)  # D2H into host DRAM (pinned on a GPU host), then storage
            digest, rid = r.digests[b], r.assign.rid
            (r.head or r).pending_copies += 1  # choice 0 holds the request's copies

            def done(_res, d=digest, s=staging, rid=rid, q=queued_s) -> None:
                self.timeline.end(("d2h", d), self.cnic_track, "d2h", rid)  # the engine's copy (fidelity: io)
                self.storage.persist(d, s, q)
                self.mail.to_self(CopyDone(rid, CopyKind.D2H, None))

            self.timeline.begin(("d2h", digest))
            self.copy(self.cache_bytes, [(table[b] * fbb, fbb)], staging, contiguous(0, fbb), done)

    def _finish(self, r: DecodeRequest) -> None:
        """Stop decoding a choice; the request's cache blocks are freed once every choice has
        stopped and no copy touches them any more."""
        if r.stage is not DecodeStage.FINISHING:
            r.move(DecodeStage.FINISHING)
        head = r.head or r
        if head.pending_copies == 0 and all(c.stage is DecodeStage.FINISHING for c in head.choices()):
            self._release(head)

    def _release(self, r: DecodeRequest) -> None:
        rid = r.assign.rid
        for c in r.others:
            self.cache.free(c.seq)
        if rid in self.cache.seq_ids:
            self.cache.free(rid)
        del self.reqs[rid]
        self.mail.ended(rid)
        self.mail.to_router(DecodeDone(rid, self.spec.engine))
