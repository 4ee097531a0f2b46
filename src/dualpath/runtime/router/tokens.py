"""The client's token stream (router step 5): the engines' token reports become `TokenEvent`s on
the request's queue, each choice's in order (OpenAI's n: the PE samples every choice's first token,
the DE decodes each), a choice's last one `finished`; the stream ends after every choice's last.
A migrated attempt (recovery.py) continues the stream at the client's next index, with the
client's prompt length in every event. Tokens stream in index order whichever engine's report
arrives first."""

from __future__ import annotations

from typing import Any

from ..api import TokenEvent, TokenLogprobs
from ..protocol import FirstToken, PromptLoaded
from .state import RouterRequest, Stream


def emit(rr: RouterRequest, metrics: Any, now_s: float, token: int, index: int, finished: bool, reason: str | None,
         logprobs: list, choice: int = 0) -> None:
    """Token `index` of a choice of this attempt (0: the PE's first token), with its logprobs on
    the wire ([]: not asked for); nothing once the attempt or the choice ended.
    The PE reports token 0 and the DE the rest, on different sockets, so the DE's token 1 may
    overtake the PE's token 0 (the PE's report queued, the DE's decode quick): a token ahead of the
    choice's next index waits in its `early` until the ones before it have streamed."""
    cs = rr.choices[choice]
    if rr.finished or cs.done or index < cs.generated:
        return
    if index > cs.generated:
        cs.early[index] = (token, finished, reason, logprobs)
        return
    _stream(rr, choice, metrics, now_s, token, finished, reason, logprobs)
    while cs.generated in cs.early and not cs.done:
        _stream(rr, choice, metrics, now_s, *cs.early.pop(cs.generated))


def _stream(rr: RouterRequest, choice: int, metrics: Any, now_s: float, token: int, finished: bool, reason: str | None,
            logprobs: list) -> None:
    """The choice's next token to the client, at the client's next index."""
    cs = rr.choices[choice]
    index = rr.base_tokens + cs.generated
    cs.generated += 1
    cs.emitted.append(token)
    if choice == 0:  # the request's TTFT and TPOT are its first choice's
        metrics.token(rr.stream_rid, index, now_s)
    if finished:
        cs.done = True
        cs.early.clear()
        if all(c.done for c in rr.choices):
            rr.end(Stream.FINISHED)
            metrics.finished(rr.stream_rid)
    prompt, cached = len(rr.origin.prompt_ids), min(len(rr.origin.prompt_ids), rr.hit_tokens)
    rr.queue.put_nowait(TokenEvent(token, index, finished, reason if finished else None, prompt, cached,
                                   rr.side.name.lower() if cached else "", TokenLogprobs.from_wire(logprobs), choice))


def first_token(rr: RouterRequest, m: FirstToken, eos_token_ids: tuple[int, ...], metrics: Any, now_s: float) -> None:
    """The PE's sampled first tokens (one per choice); an answer that one of them ends is held
    until the DE has the prompt (it has then announced the prompt's persists, so the client's next
    turn finds them)."""
    rr.hit_tokens = m.cached_tokens
    p = rr.req.params
    firsts = [(m.token, m.logprobs), *((t, lp) for t, lp in m.more)]
    ends = [p.max_tokens == 1 or (t in eos_token_ids and not p.ignore_eos and p.min_tokens <= 1) for t, _ in firsts]
    if any(ends) and not rr.prompt_loaded:
        rr.final_first_token = m
        return
    for choice, ((token, logprobs), done) in enumerate(zip(firsts, ends)):
        emit(rr, metrics, now_s, token, 0, done, "length" if p.max_tokens == 1 else "stop", logprobs, choice)


def prompt_loaded(rr: RouterRequest, m: PromptLoaded, eos_token_ids: tuple[int, ...], metrics: Any,
                  now_s: float) -> None:
    """The DE has the prompt: an answer held for it streams now; if the PE's report of the first
    tokens never came (protocol.py: PromptLoaded), the DE's copy of them stands in."""
    held = rr.final_first_token
    if held is None and rr.generated == 0:
        held = FirstToken(rr.rid, m.first_token, m.cached_tokens, m.logprobs, m.more)
    if held is not None:
        first_token(rr, held, eos_token_ids, metrics, now_s)
