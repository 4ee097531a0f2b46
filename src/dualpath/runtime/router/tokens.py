"""The client's token stream (router step 5): the engines' token reports become `TokenEvent`s on
the request's queue, in order, the last one `finished`; a migrated attempt (recovery.py) continues
the stream at the client's next index, with the client's prompt length in every event. Tokens
stream in index order whichever engine's report arrives first."""

from __future__ import annotations

from typing import Any

from ..api import TokenEvent, TokenLogprobs
from ..protocol import FirstToken, PromptLoaded
from .state import RouterRequest, Stream


def emit(rr: RouterRequest, metrics: Any, now_s: float, token: int, index: int, finished: bool, reason: str | None,
         logprobs: list) -> None:
    """Token `index` of this attempt (0: the PE's first token), with its logprobs on the wire ([]:
    not asked for); nothing once the attempt ended.
    The PE reports token 0 and the DE the rest, on different sockets, so the DE's token 1 may
    overtake the PE's token 0 (the PE's report queued, the DE's decode quick): a token ahead of the
    next index waits in `rr.early` until the ones before it have streamed."""
    if rr.finished or index < rr.generated:
        return
    if index > rr.generated:
        rr.early[index] = (token, finished, reason, logprobs)
        return
    _stream(rr, metrics, now_s, token, finished, reason, logprobs)
    while rr.generated in rr.early and not rr.finished:
        _stream(rr, metrics, now_s, *rr.early.pop(rr.generated))


def _stream(rr: RouterRequest, metrics: Any, now_s: float, token: int, finished: bool, reason: str | None,
            logprobs: list) -> None:
    """The attempt's next token to the client, at the client's next index."""
    index = rr.base_tokens + rr.generated
    rr.generated += 1
    rr.emitted.append(token)
    metrics.token(rr.stream_rid, index, now_s)
    if finished:
        rr.end(Stream.FINISHED)
        rr.early.clear()
        metrics.finished(rr.stream_rid)
    prompt, cached = len(rr.origin.prompt_ids), min(len(rr.origin.prompt_ids), rr.hit_tokens)
    rr.queue.put_nowait(TokenEvent(token, index, finished, reason if finished else None, prompt, cached,
                                   rr.side.name.lower() if cached else "", TokenLogprobs.from_wire(logprobs)))


def first_token(rr: RouterRequest, m: FirstToken, eos_token_ids: tuple[int, ...], metrics: Any, now_s: float) -> None:
    """The PE's sampled token; a one-token answer is held until the DE has the prompt (it has then
    announced the prompt's persists, so the client's next turn finds them)."""
    rr.hit_tokens = m.cached_tokens
    p = rr.req.params
    eos_ends = m.token in eos_token_ids and not p.ignore_eos and p.min_tokens <= 1
    done = p.max_tokens == 1 or eos_ends
    if done and not rr.prompt_loaded:
        rr.final_first_token = m
        return
    emit(rr, metrics, now_s, m.token, 0, done, "length" if p.max_tokens == 1 else "stop", m.logprobs)


def prompt_loaded(rr: RouterRequest, m: PromptLoaded, eos_token_ids: tuple[int, ...], metrics: Any,
                  now_s: float) -> None:
    """The DE has the prompt: a 1-token answer held for it streams now; if the PE's report of the
    first token never came (protocol.py: PromptLoaded), the DE's copy of it stands in."""
    held = rr.final_first_token
    if held is None and rr.generated == 0:
        held = FirstToken(rr.rid, m.first_token, m.cached_tokens, m.logprobs)
    if held is not None:
        first_token(rr, held, eos_token_ids, metrics, now_s)
