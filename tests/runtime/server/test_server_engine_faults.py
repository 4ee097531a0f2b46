"""A backend whose engine died (runtime/api.py contract 4, `ServiceUnavailable`): before the first
token the client gets HTTP 503 with an OpenAI error body naming the cause; mid-stream, an SSE error
event and then the end of the stream; never a hang, never a 500."""

from __future__ import annotations

import json
from typing import AsyncIterator

import httpx

from dualpath.runtime.api import GenerationRequest, ServiceUnavailable, TokenEvent
from dualpath.runtime.server.fake_backend import FakeBackend

CAUSE = "the request failed: decode engine 1 killed by SIGKILL; no engine of its role is left"


class DiesAfter(FakeBackend):
    """Streams `tokens_before` tokens of the script, then its engine 'dies'."""

    def __init__(self, tokens_before: int) -> None:
        super().__init__()
        self.tokens_before = tokens_before

    async def _dying(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        n = len(request.prompt_ids)
        for i in range(self.tokens_before):
            yield TokenEvent(ord("a") + i, i, False, None, n, 0)
        raise ServiceUnavailable(CAUSE)

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]:
        return self._dying(request)


def _chat(stream: bool) -> dict:
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 50, "stream": stream}


def test_before_the_first_token_it_is_a_503_naming_the_cause(start_server):
    server = start_server(DiesAfter(0))
    for stream in (False, True):
        r = httpx.post(server.url + "/v1/chat/completions", json=_chat(stream), timeout=10)
        assert r.status_code == 503
        assert r.json()["error"] == {"message": CAUSE, "type": "server_error", "param": None, "code": "engine_unavailable"}


def test_mid_stream_an_sse_error_event_then_done(start_server):
    server = start_server(DiesAfter(3))
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=_chat(True), timeout=10) as r:
        assert r.status_code == 200
        events = [line.removeprefix("data: ") for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_unavailable" and error["message"] == CAUSE
    text = "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-2])
    assert text == "abc"  # the tokens streamed before the engine died
    # non-streaming: the partial answer is not an answer: 503
    r = httpx.post(server.url + "/v1/chat/completions", json=_chat(False), timeout=10)
    assert r.status_code == 503 and r.json()["error"]["message"] == CAUSE
