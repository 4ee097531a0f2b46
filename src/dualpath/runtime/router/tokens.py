"""The client's token stream (router step 5): the engines' token reports become `TokenEvent`s on
the request's queue, in order, the last one `finished`; a migrated attempt (recovery.py) continues
the stream at the client's next index, with the client's prompt length in every event."""

from __future__ import annotations

from typing import Any

from ..api import TokenEvent
from ..protocol import FirstToken
from .state import RouterRequest, Stream


def emit(rr: RouterRequest, metrics: Any, now_s: float, token: int, index: int, finished: bool, reason: str | None) -> None:
    """Token `index` of this attempt (0: the PE's first token); nothing once the attempt ended."""
    if rr.finished:
        return
    rr.generated = index + 1
    index += rr.base_tokens
    rr.emitted.append(token)
    metrics.token(rr.stream_rid, index, now_s)
    if finished:
        rr.end(Stream.FINISHED)
        metrics.finished(rr.stream_rid)
    prompt = len(rr.origin.prompt_ids)
    rr.queue.put_nowait(TokenEvent(token, index, finished, reason if finished else None, prompt, min(prompt, rr.hit_tokens)))


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
    emit(rr, metrics, now_s, m.token, 0, done, "length" if p.max_tokens == 1 else "stop")
