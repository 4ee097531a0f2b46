"""Streaming a generation to an HTTP client (server path steps 4-6 of app.py): token events
become text deltas, deltas become one JSON body or SSE chunks, and a client that goes away
cancels the request on every engine.

  1. `token_deltas`: `TokenEvent`s from `ServingBackend.generate` -> text deltas (incremental
     detokenization, never a split UTF-8 character; stop strings), each choice's on its own (n);
     a choice's last carries its finish reason, the stream's last the usage.
  2. `collect_deltas` (non-streaming) or `event_stream` (SSE, ending with `data: [DONE]`).
  3. `unless_disconnected` / `EventStream`: a disconnect cancels the work; every generator in the
     chain is closed in a `finally`, shielded from cancellation (`close_quietly`).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Protocol, TypeVar

import anyio
import anyio.lowlevel
from fastapi import Request
from fastapi.responses import StreamingResponse

from dualpath.errors import InputError
from dualpath.runtime.api import NO_LOGPROBS, GenerationRequest, ServiceUnavailable, ServingBackend
from dualpath.runtime.server.detokenize import IncrementalDetokenizer, StopStrings
from dualpath.runtime.server.logprobs import LogprobEntry, chat_logprobs, completion_logprobs, spell

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    cached_path: str = ""  # TokenEvent.cached_path

    def as_json(self) -> dict:
        """OpenAI's usage, and our extension `dualpath.cached_tokens_by_path`: the cached tokens
        loaded through each read path (an OpenAI client keeps unknown fields)."""
        by_path = {path: self.cached_tokens if path == self.cached_path else 0 for path in ("prefill", "decode")}
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
                "dualpath": {"cached_tokens_by_path": by_path}}


@dataclass(frozen=True, slots=True)
class Delta:
    text: str
    finish_reason: str | None = None  # set on the choice's last delta only
    usage: Usage | None = None  # set on the stream's last delta only (every choice has finished)
    token_ids: tuple[int, ...] = ()  # the tokens this delta's text came from
    logprobs: tuple[LogprobEntry, ...] = ()  # theirs, when the request asked for them
    choice: int = 0  # which of the request's n choices


@dataclass(frozen=True, slots=True)
class Job:
    """A validated request and what its responses repeat."""

    chat: bool
    response_id: str
    created: int
    model: str
    request: GenerationRequest
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    return_token_ids: bool = False  # vLLM's: the prompt's and each choice's token ids in the response

    @property
    def logprobs(self) -> bool:
        return self.request.params.logprobs != NO_LOGPROBS


async def close_quietly(agen: Any) -> None:
    """Close an async generator even inside a cancelled scope: a router frees the request there."""
    aclose = getattr(agen, "aclose", None)
    if aclose is None:
        return
    with anyio.CancelScope(shield=True):
        try:
            await aclose()
        except Exception:
            log.exception("closing a generation stream failed")


class Progress(Protocol):
    """Who hears of a request's first and last token (admission.Ticket)."""

    def first_token(self) -> None: ...

    def finished(self) -> None: ...


async def token_deltas(router: ServingBackend, job: Job, progress: Progress | None = None) -> AsyncIterator[Delta]:
    """One delta per token (possibly empty), each choice detokenized and stopped on its own; a
    choice's last carries its finish_reason, the stream's last the usage. A choice its stop string
    ended drops its later tokens (the others go on); the stream ends when every choice has."""
    events = router.generate(job.request)
    n = job.request.params.n
    detokenizers = [IncrementalDetokenizer(router.tokenizer) for _ in range(n)]
    stops = [StopStrings(job.stops) for _ in range(n)]
    tokens, running, started = [0] * n, set(range(n)), False
    try:
        async for event in events:
            c = event.choice
            if c not in running:
                continue
            if progress is not None and not started:
                progress.first_token()
            started, tokens[c] = True, event.index + 1
            text = detokenizers[c].push(event.token_id) + (detokenizers[c].flush() if event.finished else "")
            text = stops[c].feed(text, final=event.finished)
            logprobs = () if event.logprobs is None else (spell(router.tokenizer, event.token_id, event.logprobs),)
            if not (stops[c].stopped or event.finished):
                yield Delta(text, token_ids=(event.token_id,), logprobs=logprobs, choice=c)
                continue
            running.discard(c)
            reason = "stop" if stops[c].stopped else (event.finish_reason or "stop")
            usage = None if running else Usage(event.prompt_tokens, sum(tokens), event.cached_tokens, event.cached_path)
            if usage is not None and progress is not None:
                progress.finished()
            yield Delta(text, reason, usage, (event.token_id,), logprobs, c)
            if usage is not None:
                return
    finally:
        await close_quietly(events)
    raise RuntimeError(f"router ended request {job.request.request_id} without a finished event")


async def collect_deltas(deltas: AsyncIterator[Delta]) -> list[Delta]:
    """Each choice's deltas joined into one, in choice order; the stream's usage on every one."""
    parts: dict[int, list[Delta]] = {}
    reasons: dict[int, str] = {}
    try:
        async for delta in deltas:
            parts.setdefault(delta.choice, []).append(delta)
            if delta.finish_reason is not None:
                reasons[delta.choice] = delta.finish_reason
            if delta.usage is not None:
                return [Delta("".join(d.text for d in ds), reasons[c], delta.usage,
                              tuple(t for d in ds for t in d.token_ids), tuple(e for d in ds for e in d.logprobs), c)
                        for c, ds in sorted(parts.items())]
    finally:
        await close_quietly(deltas)
    raise RuntimeError("generation ended without a finish reason")


async def _wait_for_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(request: Request, work: Callable[[], Awaitable[T]]) -> T | None:
    """`await work()`, or None if the client disconnects first (then `work` is cancelled)."""
    result: T | None = None
    error: Exception | None = None
    async with anyio.create_task_group() as group:

        async def run() -> None:
            nonlocal result, error
            try:
                result = await work()
            except Exception as exc:  # re-raised below, outside the task group (no ExceptionGroup)
                error = exc
            group.cancel_scope.cancel()

        group.start_soon(run)
        await _wait_for_disconnect(request)
        group.cancel_scope.cancel()
    if error is not None:
        raise error
    return result


class EventStream(StreamingResponse):
    """SSE that cancels its generator as soon as the client disconnects and always closes it
    (Starlette leaves an abandoned generator to the garbage collector); then `on_close` runs."""

    def __init__(self, *args: Any, on_close: Callable[[], None] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream() -> None:
                    await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        except* OSError:  # a send to a closed connection (ASGI servers of spec 2.4)
            pass
        finally:
            try:
                await close_quietly(self.body_iterator)
            finally:
                if self.on_close is not None:
                    self.on_close()


# ---- response bodies ---------------------------------------------------------------------------


def _with_token_ids(job: Job, body: dict, choice: dict, token_ids: tuple[int, ...], prompt: bool) -> None:
    """vLLM's `return_token_ids` fields: the choice's `token_ids` and, where `prompt`, the prompt's
    (`prompt_token_ids`: top level on chat, in the choice on completions)."""
    if not job.return_token_ids:
        return
    choice["token_ids"] = list(token_ids)
    if prompt:
        (body if job.chat else choice)["prompt_token_ids"] = list(job.request.prompt_ids)


def _logprobs_json(job: Job, entries: tuple[LogprobEntry, ...], offset: int) -> dict | None:
    """A choice's `logprobs` (server/logprobs.py): None unless the request asked for them;
    `offset`: the characters of the tokens' texts before these (completions' `text_offset`)."""
    if not job.logprobs:
        return None
    return chat_logprobs(entries) if job.chat else completion_logprobs(entries, offset)


def completion_json(job: Job, finals: list[Delta]) -> dict:
    """The response body of a non-streamed request: a choice per `collect_deltas` entry."""
    body = {"id": job.response_id, "object": "chat.completion" if job.chat else "text_completion",
            "created": job.created, "model": job.model, "choices": [],
            "usage": finals[0].usage.as_json() if finals[0].usage else None}
    for final in finals:
        choice: dict[str, Any] = {"index": final.choice, "logprobs": _logprobs_json(job, final.logprobs, 0),
                                  "finish_reason": final.finish_reason}
        if job.chat:
            choice["message"] = {"role": "assistant", "content": final.text}
        else:
            choice["text"] = final.text
        body["choices"].append(choice)
        _with_token_ids(job, body, choice, final.token_ids, prompt=True)
    return body


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _chunk(job: Job, text: str | None, finish_reason: str | None = None, role: bool = False,
           delta: Delta | None = None, first: bool = False, offset: int = 0, index: int = 0) -> str:
    """A chunk with one choice (`index`, or the delta's); `text` None means an empty delta (the
    finishing chunk); `delta`: the one whose token ids and logprobs the chunk carries (`offset`:
    _logprobs_json); `first`: the stream's first chunk (it carries the prompt's token ids when
    asked for)."""
    entries = delta.logprobs if delta is not None else ()
    choice: dict[str, Any] = {"index": delta.choice if delta is not None else index,
                              "logprobs": _logprobs_json(job, entries, offset) if entries else None,
                              "finish_reason": finish_reason}
    if job.chat:
        choice["delta"] = {"role": "assistant", "content": text or ""} if role else (
            {"content": text} if text is not None else {})
    else:
        choice["text"] = text or ""
    body = {"id": job.response_id, "object": "chat.completion.chunk" if job.chat else "text_completion",
            "created": job.created, "model": job.model, "choices": [choice]}
    _with_token_ids(job, body, choice, delta.token_ids if delta is not None else (), prompt=first)
    if job.include_usage:
        body["usage"] = None
    return _sse(body)


async def event_stream(job: Job, first: Delta, deltas: AsyncIterator[Delta]) -> AsyncIterator[str]:
    try:
        opening = True  # the next chunk is the stream's first
        n = job.request.params.n
        if job.chat:  # each choice opens with its role
            for c in range(n):
                yield _chunk(job, "", role=True, first=c == 0, index=c)
            opening = False
        delta, offsets = first, [0] * n  # per choice: the characters of the tokens' texts sent (_logprobs_json)
        while True:
            # no token's id or logprobs go unsent, even where its text is still held back
            if delta.text or delta.logprobs or (job.return_token_ids and delta.token_ids):
                yield _chunk(job, delta.text, delta=delta, first=opening, offset=offsets[delta.choice])
                offsets[delta.choice] += sum(len(e.sampled.text) for e in delta.logprobs)
                opening = False
            if delta.finish_reason is not None:  # the choice's end
                yield _chunk(job, None, delta.finish_reason, first=opening, index=delta.choice)
                opening = False
            if delta.usage is not None:  # the stream's end
                break
            # The router (events already queued) and a send to a gone client may both return without
            # suspending; this lets the disconnect listener run, so a gone client is noticed.
            await anyio.lowlevel.checkpoint()
            delta = await anext(deltas)
        if job.include_usage and delta.usage is not None:
            yield _sse({"id": job.response_id, "object": "chat.completion.chunk" if job.chat else "text_completion",
                        "created": job.created, "model": job.model, "choices": [], "usage": delta.usage.as_json()})
    except InputError as exc:  # the status line is sent already: report in the stream, as vLLM does
        yield _sse({"error": {"message": str(exc), "type": "invalid_request_error", "param": None, "code": None}})
    except ServiceUnavailable as exc:  # its engine died mid-stream and none could continue it
        yield _sse({"error": {"message": str(exc), "type": "server_error", "param": None, "code": exc.code}})
    except Exception:
        log.exception("generation of %s failed mid-stream", job.response_id)
        yield _sse({"error": {"message": "internal server error", "type": "server_error", "param": None, "code": None}})
    finally:
        await close_quietly(deltas)
    yield "data: [DONE]\n\n"
