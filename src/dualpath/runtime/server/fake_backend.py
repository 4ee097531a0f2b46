"""`FakeBackend`: an in-process, deterministic `Router` (runtime/api.py) for developing and testing
the HTTP server without engines.

Path of a request through it:
  1. `generate` returns an async generator and keeps a reference to it, as a real router's
     request table would (so only the server closing or exhausting it frees the request, never
     the garbage collector); at the first pull the request joins `active_request_ids` and `received`.
  2. `cached_tokens` = the longest prefix of the prompt seen in an earlier request (its prompt or its
     prompt + generated tokens), counted in whole blocks of `block_tokens` and never the whole
     prompt (the last token is always computed, as in a real prefix cache).
  3. after `first_token_delay_s` ("prefill"), it yields the scripted reply `reply(prompt_ids)`
     one token per `token_delay_s`; EOS follows the script unless `ignore_eos` or `min_tokens`
     says to continue (then the script repeats). `max_tokens` ends it with "length". Asked for
     logprobs, each token carries made-up ones (`fake_logprobs`); each of `n` choices follows the
     script, their tokens interleaved.
  4. `fail_after_tokens(prompt_ids)`, when set and not None, is the number of tokens after which
     the request fails with `InjectedBackendError` (a backend fault, for the server's error paths);
  5. finished or closed early (client gone, or failed), the request leaves `active_request_ids`
     and its tokens enter the prefix index; closed early, its id is added to `cancelled_request_ids`
     (failed: to `failed_request_ids`).

It checks the server's side of the contract: a request past `max_context_tokens` raises.
"""

from __future__ import annotations

import asyncio
import math
from typing import AsyncIterator, Callable, Sequence

from dualpath.runtime.api import NO_LOGPROBS, GenerationRequest, TokenEvent, TokenizerLike, TokenLogprobs
from dualpath.metrics.prometheus import Family, Sample, family

DEFAULT_REPLY_TEXT = "Hello from the fake router: naïve café, 日本語, 🙂!"


def fake_logprobs(token: int, index: int, top: int) -> TokenLogprobs | None:
    """Made-up logprobs in the real ones' shape (None unless asked for): the scripted token is the
    most likely at log(1/(index + 2)), the next token ids follow one nat apart."""
    if top == NO_LOGPROBS:
        return None
    logprob = -math.log(index + 2)
    return TokenLogprobs(logprob, tuple((token + i, logprob - i) for i in range(top)))


class InjectedBackendError(RuntimeError):
    """The fault `fail_after_tokens` asks for."""


class FakeBackend:
    def __init__(
        self,
        tokenizer: TokenizerLike | None = None,
        *,
        model_name: str = "dualpath-fake",
        max_context_tokens: int = 4096,
        eos_token_ids: tuple[int, ...] | None = None,
        reply: Callable[[tuple[int, ...]], Sequence[int]] | None = None,
        block_tokens: int = 64,
        token_delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
        fail_after_tokens: Callable[[tuple[int, ...]], int | None] | None = None,
    ) -> None:
        """`tokenizer` defaults to the `tiny` model's byte-level one (a token per byte, so any
        non-ASCII character spans several tokens); `reply` maps prompt ids to the scripted reply
        ids (default: `DEFAULT_REPLY_TEXT` encoded)."""
        if tokenizer is None:
            from dualpath.runtime.model.loader import tiny_tokenizer

            tokenizer = tiny_tokenizer()
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_context_tokens = max_context_tokens
        if eos_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            eos_token_ids = () if eos is None else (eos,)
        if not eos_token_ids:
            raise ValueError("FakeBackend needs at least one EOS token id")
        self.eos_token_ids = tuple(eos_token_ids)
        default_reply = tuple(tokenizer.encode(DEFAULT_REPLY_TEXT, allow_added_tokens=False))
        self._reply = reply if reply is not None else (lambda _prompt: default_reply)
        self.block_tokens = block_tokens
        self.token_delay_s = token_delay_s
        self.first_token_delay_s = first_token_delay_s
        self._fail_after_tokens = fail_after_tokens
        self.failed_request_ids: list[str] = []
        self.received: list[GenerationRequest] = []
        self.cancelled_request_ids: list[str] = []
        self._active: set[str] = set()
        self._streams: dict[str, AsyncIterator[TokenEvent]] = {}
        # chained hash of each block-aligned prefix seen -> that prefix's last block (checked on a hit)
        self._blocks: dict[int, tuple[int, ...]] = {}
        self.num_finished = 0
        self.num_generated_tokens = 0

    @property
    def active_request_ids(self) -> frozenset[str]:
        return frozenset(self._active)

    # ---- prefix index --------------------------------------------------------------------------

    def _prefix_blocks(self, ids: Sequence[int]) -> list[tuple[int, tuple[int, ...]]]:
        """(chained hash, block tokens) of each whole block of `ids`."""
        out, parent = [], 0
        for start in range(0, len(ids) - self.block_tokens + 1, self.block_tokens):
            block = tuple(ids[start : start + self.block_tokens])
            parent = hash((parent, block))
            out.append((parent, block))
        return out

    def cached_tokens_for(self, prompt_ids: Sequence[int]) -> int:
        """Whole blocks of `prompt_ids[:-1]` found in the index, in tokens."""
        num_blocks = 0
        for h, block in self._prefix_blocks(prompt_ids[:-1]):
            if self._blocks.get(h) != block:
                break
            num_blocks += 1
        return num_blocks * self.block_tokens

    def _remember(self, ids: Sequence[int]) -> None:
        self._blocks.update(self._prefix_blocks(ids))

    # ---- generation ----------------------------------------------------------------------------

    def _next_token(self, script: Sequence[int], index: int, request: GenerationRequest) -> int:
        params = request.params
        may_stop = not params.ignore_eos and index >= params.min_tokens
        if index < len(script):
            return script[index]
        if may_stop or not script:
            return self.eos_token_ids[0]
        return script[index % len(script)]

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        stream = self._generate(request)
        # A strong reference until the stream ends, as a real router's request table holds one: the
        # request is freed only when the server exhausts or closes the stream, never by the garbage
        # collector (which would hide a server that forgets to close it).
        self._streams[request.request_id] = stream
        return stream

    async def _generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        prompt = request.prompt_ids
        params = request.params
        if not prompt or len(prompt) + params.max_tokens > self.max_context_tokens:
            self._streams.pop(request.request_id, None)
            raise ValueError(
                f"contract: {len(prompt)} prompt + {params.max_tokens} max tokens vs a window of "
                f"{self.max_context_tokens}; the server must reject this"
            )
        self.received.append(request)
        self._active.add(request.request_id)
        cached_tokens = self.cached_tokens_for(prompt)
        self._remember(prompt)
        generated: list[int] = []
        finished = failed = False
        fail_at = None if self._fail_after_tokens is None else self._fail_after_tokens(prompt)
        try:
            script = tuple(self._reply(prompt))
            if self.first_token_delay_s > 0:
                await asyncio.sleep(self.first_token_delay_s)
            stop_ids = set(self.eos_token_ids) | set(params.stop_token_ids)
            for index in range(params.max_tokens):
                if index > 0 and self.token_delay_s > 0:
                    await asyncio.sleep(self.token_delay_s)
                if index == fail_at:
                    failed = True
                    raise InjectedBackendError(f"injected backend failure after {index} tokens")
                token = self._next_token(script, index, request)
                generated.append(token)
                stopped = token in stop_ids and index >= params.min_tokens and not params.ignore_eos
                last = stopped or index == params.max_tokens - 1
                finished = last
                for choice in range(params.n):  # every choice follows the script
                    self.num_generated_tokens += 1
                    yield TokenEvent(
                        token_id=token,
                        index=index,
                        finished=last,
                        finish_reason=("stop" if stopped else "length") if last else None,
                        prompt_tokens=len(prompt),
                        cached_tokens=cached_tokens,
                        logprobs=fake_logprobs(token, index, params.logprobs),
                        choice=choice,
                    )
                if last:
                    return
        finally:
            self._streams.pop(request.request_id, None)
            self._active.discard(request.request_id)
            self._remember((*prompt, *generated))
            if finished:
                self.num_finished += 1
            elif failed:
                self.failed_request_ids.append(request.request_id)
            else:
                self.cancelled_request_ids.append(request.request_id)

    # ---- observability -------------------------------------------------------------------------

    def health(self) -> dict:
        return {"model": self.model_name, "num_active_requests": len(self._active)}

    def metric_families(self) -> list[Family]:
        return [
            family("dualpath_router_requests_total", "counter", "Requests received by the router.", [Sample(len(self.received))]),
            family("dualpath_router_requests_finished_total", "counter", "Requests that ran to EOS, a stop token or max_tokens.",
                   [Sample(self.num_finished)]),
            family("dualpath_router_requests_cancelled_total", "counter", "Requests closed before finishing (client gone).",
                   [Sample(len(self.cancelled_request_ids))]),
            family("dualpath_router_active_requests", "gauge", "Requests in flight.", [Sample(len(self._active))]),
            family("dualpath_router_generated_tokens_total", "counter", "Tokens generated.", [Sample(self.num_generated_tokens)]),
        ]
