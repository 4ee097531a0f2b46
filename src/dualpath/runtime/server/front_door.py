"""The outermost ASGI layer (server path step 1 of app.py), before FastAPI sees anything:

  1. the API key on /v1/ routes, compared in constant time (401 otherwise); with keys mapped to
     tenants, the key's tenant goes in the request's scope (`TENANT_KEY`: its cache salt, app.py);
  2. the body limit: a POST body over `max_body_bytes` is a 413 before any of it is parsed,
     whether the client declared its size (`Content-Length`: refused before a byte is read, so a
     client sending `Expect: 100-continue` never sends it) or streamed it chunked (refused as soon
     as the bytes read pass the limit; the rest is never read). A body within the limit is read
     whole here and replayed to the app, then `receive` is the server's again (disconnects);
  3. every response counted by route and status, for /metrics.
"""

from __future__ import annotations

import hmac
from collections import Counter
from typing import Any, Mapping

from dualpath.runtime.server.openai_schema import error_response

TENANT_KEY = "dualpath.tenant"  # the scope's entry: the tenant of the request's API key ("" without tenants)
ROUTES = ("/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions")
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class _ClientGone(Exception):
    """The client disconnected while its body was being read: nothing to answer."""


class FrontDoor:
    def __init__(self, app: Any, responses: Counter[tuple[str, int]], api_keys: Mapping[str, str] | None,
                 max_body_bytes: int) -> None:
        """`api_keys`: each accepted key -> its tenant ("" for none); None: no key needed."""
        self.app, self.responses, self.max_body_bytes = app, responses, max_body_bytes
        self.expected = None if api_keys is None else [(f"Bearer {k}".encode(), t) for k, t in api_keys.items()]

    def _tenant(self, scope: dict) -> str | None:
        """The tenant of the request's key, or None when it has none of ours (every key compared,
        each in constant time, so the time does not say which key came close)."""
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        found = None
        for expected, tenant in self.expected or ():
            if hmac.compare_digest(given, expected):
                found = tenant
        return found

    def _declared_too_large(self, scope: dict) -> bool:
        length = dict(scope.get("headers") or ()).get(b"content-length")
        # the HTTP server (h11 / httptools) has refused a malformed Content-Length already
        return length is not None and length.strip().isdigit() and int(length) > self.max_body_bytes

    async def _read_body(self, receive: Any) -> bytes | None:
        """The whole body, or None once it passes the limit (the rest stays unread)."""
        parts: list[bytes] = []
        num_bytes = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _ClientGone
            chunk = message.get("body", b"")
            num_bytes += len(chunk)
            if num_bytes > self.max_body_bytes:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts)

    def _too_large(self) -> Any:
        return error_response(413, f"the request body is larger than this server's limit of {self.max_body_bytes} "
                                   "bytes", code="request_too_large")

    async def _dispatch(self, scope: dict, receive: Any, send: Any) -> None:
        if self.expected is not None and scope["path"].startswith("/v1/"):
            tenant = self._tenant(scope)
            if tenant is None:
                response = error_response(401, "invalid or missing API key (send 'Authorization: Bearer <key>')",
                                          code="invalid_api_key", kind="authentication_error")
                response.headers["WWW-Authenticate"] = "Bearer"
                await response(scope, receive, send)
                return
            scope[TENANT_KEY] = tenant
        if scope.get("method") not in _BODY_METHODS:
            await self.app(scope, receive, send)
            return
        if self._declared_too_large(scope):
            await self._too_large()(scope, receive, send)
            return
        try:
            body = await self._read_body(receive)
        except _ClientGone:
            return
        if body is None:
            await self._too_large()(scope, receive, send)
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = scope["path"] if scope["path"] in ROUTES else "other"
        status = 499  # the client left before any response started (nginx's "client closed request")

        async def counting_send(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self._dispatch(scope, receive, counting_send)
        except BaseException:
            if status == 499:
                status = 500
            raise
        finally:
            self.responses[(route, status)] += 1
