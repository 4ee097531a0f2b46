"""OpenAI-compatible HTTP front end over any `ServingBackend` (runtime/api.py).

Path of a request through the server:
  1. `FrontDoor` (front_door.py, the outermost ASGI layer) checks the API key on /v1/ routes (401
     otherwise) and the body size (413 past `ServerLimits.max_body_bytes`, before any parsing), and
     counts every response by route and status for /metrics;
  2. FastAPI parses the body into `ChatCompletionBody` / `CompletionBody` (strict types); any
     client mistake becomes a 400 with an OpenAI error body naming the field (`param`);
  3. admission (admission.py): a server at its request limit answers 429 with `Retry-After` at
     once; else `_Server.prepare` (in a worker thread: chat rendering and BPE are CPU work) renders
     and encodes the prompt, checks the prompt limit and the context window and builds the
     `GenerationRequest`; then its prompt tokens are admitted (or 429) and a `Ticket` follows the
     request to its terminal state;
  4. `streaming.token_deltas` pulls `TokenEvent`s from `router.generate` and turns them into text deltas:
     incremental detokenization (never a split UTF-8 character) and stop strings;
  5. non-streaming: the deltas are collected; streaming: the first delta is pulled before the
     response starts (so a router `InputError` is still a 400, a `ServiceUnavailable` a 503), then
     SSE chunks follow, ending with `data: [DONE]` (after an error event if the backend failed);
  6. a client that disconnects (before or during the stream) cancels its request: every
     generator in the chain (SSE -> deltas -> router) is closed in a `finally`, shielded from
     cancellation, so the router frees the request on every engine.

Wall time (for OpenAI's `created`) is read only by `system_wall_time_s`, elapsed time only by
`system_monotonic_s`; tests inject their own.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from typing import AsyncContextManager, Callable, Mapping

import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from dualpath.errors import InputError
from dualpath.runtime.api import NO_LOGPROBS, GenerationRequest, SamplingParams, ServiceUnavailable, ServingBackend
from dualpath.runtime.server.admission import Admission, Overloaded, ServerLimits, Ticket
from dualpath.runtime.server.front_door import TENANT_KEY, FrontDoor
from dualpath.runtime.server.openai_schema import NEUTRAL_VALUES, ChatCompletionBody, CompletionBody, RequestError, _validation_response, error_response
from dualpath.runtime.server.streaming import (EventStream, Job, close_quietly, collect_deltas, completion_json, event_stream,
                                               token_deltas, unless_disconnected)
from dualpath.metrics.prometheus import CONTENT_TYPE, Sample, family, render

log = logging.getLogger(__name__)
Lifespan = Callable[[FastAPI], AsyncContextManager[None]]
CLIENT_CLOSED_STATUS = 499  # nginx's "client closed request": logged and counted, never received


def system_wall_time_s() -> float:
    """Seconds since the Unix epoch: the server's only read of wall time (for `created`)."""
    return time.time()


def system_monotonic_s() -> float:
    """Monotonic seconds: the server's only read of elapsed time (admission's service times)."""
    return time.monotonic()


def random_request_id() -> str:
    return uuid.uuid4().hex


def _utf8_text(text: str, param: str) -> str:
    """JSON can carry a lone UTF-16 surrogate ("\\ud800") that no tokenizer can encode: a 400."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise RequestError(f"{param}: not valid Unicode text (a lone surrogate at character {exc.start})", param) from None
    return text



# ---- the application ---------------------------------------------------------------------------


class _Server:
    def __init__(self, router: ServingBackend, wall_time_s: Callable[[], float], new_request_id: Callable[[], str],
                 admission: Admission) -> None:
        self.router = router
        self.admission = admission
        self.wall_time_s = wall_time_s
        self.new_request_id = new_request_id
        self.started = int(wall_time_s())
        self.responses: Counter[tuple[str, int]] = Counter()  # (route, status) -> count

    def _prompt_ids(self, body: ChatCompletionBody | CompletionBody) -> list[int]:
        tokenizer = self.router.tokenizer
        if isinstance(body, ChatCompletionBody):
            messages = [{"role": m.role, "content": m.content} for m in body.messages]
            try:
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
            except Exception as exc:  # e.g. a template's raise_exception("roles must alternate")
                raise RequestError(f"messages: the chat template rejected them: {exc}", "messages") from exc
            return tokenizer.encode(_utf8_text(text, "messages"), allow_added_tokens=True)
        if isinstance(body.prompt, str):
            return tokenizer.encode(_utf8_text(body.prompt, "prompt"), allow_added_tokens=True)
        vocab_size = getattr(tokenizer, "vocab_size", None)
        if vocab_size is not None and any(t >= vocab_size for t in body.prompt):
            raise RequestError(f"prompt: token ids must be below the vocabulary size {vocab_size}", "prompt")
        return list(body.prompt)

    def _max_tokens(self, body: ChatCompletionBody | CompletionBody, num_prompt_tokens: int) -> int:
        """max_tokens (default: the rest of the context window), checked against the window."""
        chat = isinstance(body, ChatCompletionBody)
        prompt_param = "messages" if chat else "prompt"
        name, value = ("max_completion_tokens", body.max_completion_tokens) if chat and (
            body.max_completion_tokens is not None) else ("max_tokens", body.max_tokens)
        window = self.router.max_context_tokens
        room = window - num_prompt_tokens
        if room <= 0:
            raise RequestError(f"{prompt_param}: {num_prompt_tokens} tokens leave no room to generate in this "
                               f"model's context window of {window} tokens", prompt_param, "context_length_exceeded")
        if value is not None and value > room:
            raise RequestError(f"{name}: {num_prompt_tokens} prompt tokens + {value} to generate exceed this model's "
                               f"context window of {window} tokens", name, "context_length_exceeded")
        return room if value is None else value

    @staticmethod
    def _logprobs(body: ChatCompletionBody | CompletionBody) -> int:
        """SamplingParams.logprobs: chat's top_logprobs once logprobs is true; completions' logprobs."""
        if isinstance(body, CompletionBody):
            return NO_LOGPROBS if body.logprobs is None else body.logprobs
        if body.top_logprobs is not None and not body.logprobs:
            raise RequestError("top_logprobs: needs logprobs: true", "top_logprobs")
        return (body.top_logprobs or 0) if body.logprobs else NO_LOGPROBS

    def prepare(self, body: ChatCompletionBody | CompletionBody, tenant: str = "") -> Job:
        """The request's job; `tenant`: its API key's (front_door.py), which salts its cache."""
        chat = isinstance(body, ChatCompletionBody)
        if body.model is not None and body.model != self.router.model_name:
            raise RequestError(f"model: {body.model!r} does not exist; this server serves "
                               f"{self.router.model_name!r}", "model", "model_not_found")
        for name, value in (body.model_extra or {}).items():
            if name in NEUTRAL_VALUES and value not in NEUTRAL_VALUES[name]:
                raise RequestError(f"{name}: not supported by this server", name, "unsupported_parameter")
        prompt_ids = self._prompt_ids(body)
        if not prompt_ids:
            raise RequestError("the prompt is empty (0 tokens)", "messages" if chat else "prompt")
        limit = self.admission.limits.max_prompt_tokens
        if len(prompt_ids) > limit:
            raise RequestError(f"{len(prompt_ids)} prompt tokens are more than this server's limit of {limit}",
                               "messages" if chat else "prompt", "prompt_too_long")
        max_tokens = self._max_tokens(body, len(prompt_ids))
        min_tokens = body.min_tokens or 0
        if min_tokens > max_tokens:
            raise RequestError(f"min_tokens: {min_tokens} is more than max_tokens ({max_tokens})", "min_tokens")
        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=1.0 if body.temperature is None else body.temperature,
            top_p=1.0 if body.top_p is None else body.top_p,
            seed=body.seed,
            min_tokens=min_tokens,
            ignore_eos=bool(body.ignore_eos),
            logprobs=self._logprobs(body),
            n=body.n or 1,
        )
        response_id = f"{'chatcmpl' if chat else 'cmpl'}-{self.new_request_id()}"
        return Job(chat=chat, response_id=response_id, created=int(self.wall_time_s()), model=self.router.model_name,
                   request=GenerationRequest(response_id, tuple(prompt_ids), params, cache_salt(tenant, body.cache_salt)),
                   stops=tuple(body.stop or ()),
                   stream=bool(body.stream), return_token_ids=bool(body.return_token_ids),
                   include_usage=bool(body.stream and body.stream_options and body.stream_options.include_usage))

    async def respond(self, request: Request, body: ChatCompletionBody | CompletionBody) -> Response:
        self.admission.check_room()  # a full server answers 429 before spending CPU on the prompt
        job = await anyio.to_thread.run_sync(self.prepare, body, request.scope.get(TENANT_KEY, ""))
        ticket = self.admission.admit(len(job.request.prompt_ids))
        try:
            return await self._generate(request, job, ticket)
        except BaseException:
            ticket.release()
            raise

    async def _generate(self, request: Request, job: Job, ticket: Ticket) -> Response:
        """The response of an admitted request; `ticket` is released at its terminal state (here,
        or when the SSE stream closes)."""
        deltas = token_deltas(self.router, job, ticket)
        try:
            # streaming: only the first delta, so that a router's InputError is still a 400
            outcome = await unless_disconnected(request, lambda: anext(deltas) if job.stream else collect_deltas(deltas))
        except BaseException:
            await close_quietly(deltas)
            raise
        if outcome is None:
            await close_quietly(deltas)
            ticket.release()
            return Response(status_code=CLIENT_CLOSED_STATUS)
        if not job.stream:
            ticket.release()
            return JSONResponse(completion_json(job, outcome))
        return EventStream(event_stream(job, outcome, deltas), media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}, on_close=ticket.release)

    def health(self) -> JSONResponse:
        try:
            body = {"status": "ok", **self.router.health()}
        except Exception:
            log.exception("router.health() failed")
            body = {"status": "error"}
        # degraded: an engine is down but every role is still served (runtime/router/liveness.py)
        return JSONResponse(body, status_code=200 if body["status"] in ("ok", "degraded") else 503)

    def metrics(self) -> PlainTextResponse:
        samples = [Sample(n, {"route": route, "code": str(code)})
                   for (route, code), n in sorted(self.responses.items())]
        own = family("dualpath_http_responses_total", "counter", "HTTP responses by route and status.", samples)
        return PlainTextResponse(render(*self.router.metric_families(), *self.admission.metric_families(), own),
                                 media_type=CONTENT_TYPE)

    def models(self) -> dict:
        return {"object": "list", "data": [{"id": self.router.model_name, "object": "model", "created": self.started,
                                            "owned_by": "dualpath", "max_model_len": self.router.max_context_tokens}]}


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as OpenAI's error body: client mistakes 400 (naming the field), overload 429,
    anything unexpected 500 without details."""

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return _validation_response(exc, request.headers.get("content-type", ""))

    @app.exception_handler(RequestError)
    async def on_request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(Overloaded)
    async def on_overloaded(_: Request, exc: Overloaded) -> JSONResponse:
        # OpenAI's 429 body names the limit in `type` ("requests" or "tokens")
        response = error_response(429, exc.message, code="rate_limit_exceeded", kind=exc.limit)
        response.headers["Retry-After"] = str(exc.retry_after_s)
        return response

    @app.exception_handler(InputError)
    async def on_input_error(_: Request, exc: InputError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(ServiceUnavailable)
    async def on_unavailable(_: Request, exc: ServiceUnavailable) -> JSONResponse:
        return error_response(503, str(exc), code=exc.code, kind="server_error")

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, str(exc.detail), code=str(exc.status_code))

    @app.exception_handler(Exception)
    async def on_server_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, "internal server error", kind="server_error")


def cache_salt(tenant: str, salt: str | None) -> str:
    """The salt of a request's cache keys: its tenant's, then its own `cache_salt` within the
    tenant, so that two tenants never share a block whatever salts they send ("": none)."""
    if not tenant:
        return salt or ""
    return f"tenant {tenant}\x00{salt or ''}"


def create_app(router: ServingBackend, api_key: str | Mapping[str, str] | None = None, *,
               limits: ServerLimits = ServerLimits(),
               wall_time_s: Callable[[], float] = system_wall_time_s, monotonic_s: Callable[[], float] = system_monotonic_s,
               new_request_id: Callable[[], str] = random_request_id, lifespan: Lifespan | None = None) -> FastAPI:
    """The OpenAI-compatible API over `router`. With `api_key`, /v1/ routes need
    `Authorization: Bearer <api_key>`; /health and /metrics stay open (probes, scrapers). Given
    as a map of keys to tenants, each key's requests are cached under its tenant (`cache_salt`).
    `limits` bound what is accepted (admission.py; 429 / 413 / 400 beyond them). `lifespan`
    (FastAPI's) runs on the server's event loop: start the router there, stop it after.
    The app's admission ledger is `app.state.admission`."""
    admission = Admission(limits, monotonic_s)
    server = _Server(router, wall_time_s, new_request_id, admission)
    app = FastAPI(title="dualpath", summary="OpenAI-compatible API of the dualpath runtime", lifespan=lifespan)
    app.state.admission = admission
    keys = {api_key: ""} if isinstance(api_key, str) else api_key
    app.add_middleware(FrontDoor, responses=server.responses, api_keys=keys, max_body_bytes=limits.max_body_bytes)

    _add_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        return server.health()

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return server.metrics()

    @app.get("/v1/models")
    async def models() -> dict:
        return server.models()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> JSONResponse:
        if model_id != router.model_name:
            return error_response(404, f"model {model_id!r} does not exist", "model", "model_not_found")
        return JSONResponse(server.models()["data"][0])

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Response:
        return await server.respond(request, body)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionBody, request: Request) -> Response:
        return await server.respond(request, body)

    return app


def serve(router: ServingBackend, host: str = "127.0.0.1", port: int = 8000, api_key: str | Mapping[str, str] | None = None, *,
          limits: ServerLimits = ServerLimits(), lifespan: Lifespan | None = None, log_level: str = "info",
          graceful_shutdown_s: int = 5) -> None:
    """Run the API with uvicorn until interrupted; binds to localhost unless told otherwise. On
    shutdown, streams still open after `graceful_shutdown_s` are cancelled (freeing their requests)."""
    import uvicorn

    uvicorn.run(create_app(router, api_key, limits=limits, lifespan=lifespan), host=host, port=port, log_level=log_level,
                timeout_graceful_shutdown=graceful_shutdown_s)
