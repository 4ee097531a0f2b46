"""Client mistakes get a 400 naming the field (OpenAI's error shape), never a 500; the server keeps serving."""

from __future__ import annotations

import contextlib

import httpx
import pytest

from dualpath.runtime.server.fake_backend import FakeBackend

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
WINDOW_TOKENS = 256

# (route, raw body or JSON, expected param)
CASES = [
    (CHAT, b"{not json", None),
    (CHAT, b"[1, 2]", None),
    (CHAT, {}, "messages"),
    (CHAT, {"messages": []}, "messages"),
    (CHAT, {"messages": "hi"}, "messages"),
    (CHAT, {"messages": [{"role": "user"}]}, "messages.[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}]}, "messages.[1].role"),
    (CHAT, {"messages": [{"role": "user", "content": 5}]}, "messages.[0].content"),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages.[0].content"),
    (CHAT, {"messages": USER, "model": "gpt-4o"}, "model"),
    (CHAT, {"messages": USER, "model": 3}, "model"),
    (CHAT, {"messages": USER, "max_tokens": 0}, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": -5}, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 2.5}, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": "10"}, "max_tokens"),
    (CHAT, {"messages": USER, "max_tokens": True}, "max_tokens"),
    (CHAT, {"messages": USER, "max_completion_tokens": 0}, "max_completion_tokens"),
    (CHAT, {"messages": USER, "temperature": -0.1}, "temperature"),
    (CHAT, {"messages": USER, "temperature": "hot"}, "temperature"),
    (CHAT, {"messages": USER, "top_p": 0}, "top_p"),
    (CHAT, {"messages": USER, "top_p": 1.5}, "top_p"),
    (CHAT, {"messages": USER, "seed": "x"}, "seed"),
    (CHAT, {"messages": USER, "seed": 2**64}, "seed"),  # beyond the engines' signed 64 bits (it used to hang)
    (CHAT, {"messages": USER, "seed": -(2**63) - 1}, "seed"),
    (CHAT, b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}', "messages"),  # a lone surrogate (was a 500)
    (COMPLETIONS, b'{"prompt": "\\udc00"}', "prompt"),
    (CHAT, {"messages": USER, "stream": "yes"}, "stream"),
    (CHAT, {"messages": USER, "stop": [""]}, "stop"),
    (CHAT, {"messages": USER, "stop": [3]}, "stop.[0]"),
    (CHAT, {"messages": USER, "n": 0}, "n"),
    (CHAT, {"messages": USER, "n": 17}, "n"),
    (CHAT, {"messages": USER, "min_tokens": -1}, "min_tokens"),
    (CHAT, {"messages": USER, "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
    (CHAT, {"messages": USER, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    (CHAT, {"messages": USER, "echo": True}, "echo"),
    (CHAT, {"messages": USER, "max_tokens": WINDOW_TOKENS}, "max_tokens"),  # prompt + max_tokens > window
    (CHAT, {"messages": [{"role": "user", "content": "x" * WINDOW_TOKENS}]}, "messages"),  # prompt alone too long
    (COMPLETIONS, {}, "prompt"),
    (COMPLETIONS, {"prompt": ""}, "prompt"),
    (COMPLETIONS, {"prompt": []}, "prompt"),
    (COMPLETIONS, {"prompt": ["a", "b"]}, "prompt"),
    (COMPLETIONS, {"prompt": [1, -2]}, "prompt"),
    (COMPLETIONS, {"prompt": [1, 10_000]}, "prompt"),  # beyond the vocabulary
    (COMPLETIONS, {"prompt": "hi", "max_tokens": 300}, "max_tokens"),
    (COMPLETIONS, {"prompt": list(range(WINDOW_TOKENS))}, "prompt"),
    (COMPLETIONS, {"prompt": "hi", "echo": True}, "echo"),
]


@pytest.fixture
def server(start_server):
    return start_server(FakeBackend(max_context_tokens=WINDOW_TOKENS))


def test_malformed_requests_are_400_naming_the_field(server):
    with httpx.Client(base_url=server.url) as client:
        for route, body, param in CASES:
            for stream in (False, True):
                if isinstance(body, bytes):
                    response = client.post(route, content=body, headers={"Content-Type": "application/json"})
                else:
                    response = client.post(route, json={**body, "stream": stream} if "stream" not in body else body)
                assert response.status_code == 400, (route, body, response.text)
                error = response.json()["error"]
                assert error["type"] == "invalid_request_error" and error["param"] == param, (body, error)
                assert error["message"] and "Traceback" not in response.text
        assert server.router.received == []  # nothing reached the router
        good = client.post(CHAT, json={"messages": USER, "max_tokens": 3})
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3


def test_context_window_edge_is_allowed(server, tokenizer):
    prompt = list(range(100))
    with httpx.Client(base_url=server.url) as client:
        exact = client.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": WINDOW_TOKENS - 100, "ignore_eos": True})
        over = client.post(COMPLETIONS, json={"prompt": prompt, "max_tokens": WINDOW_TOKENS - 99})
    assert exact.status_code == 200 and exact.json()["usage"]["completion_tokens"] == WINDOW_TOKENS - 100
    assert over.status_code == 400 and over.json()["error"]["code"] == "context_length_exceeded"


def test_unknown_fields_and_neutral_values_are_accepted(server):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2,
            "user": "someone", "logprobs": False, "presence_penalty": 0, "n": 1, "stop": "never", "temperature": None}
    response = httpx.post(server.url + CHAT, json=body)
    assert response.status_code == 200, response.text
    assert server.router.received[-1].params.temperature == 1.0


def test_unknown_route_and_method_are_json_errors(server):
    assert httpx.get(server.url + "/v1/nothing").json()["error"]["code"] == "404"
    response = httpx.get(server.url + CHAT)
    assert response.status_code == 405 and "error" in response.json()


def test_body_must_be_a_json_object(server):
    body = b'{"messages": [{"role": "user", "content": "hi"}]}'
    cases = [({"Content-Type": "text/plain"}, body, "invalid_content_type"),
             ({"Content-Type": "application/json"}, b"", "missing_body"),
             ({"Content-Type": "application/json"}, b"null", "invalid_body"),
             ({"Content-Type": "application/json"}, b'{"messages": [}', "invalid_json")]
    for headers, content, code in cases:
        response = httpx.post(server.url + CHAT, content=content, headers=headers)
        assert response.status_code == 400 and response.json()["error"]["code"] == code, response.text


def test_chat_template_errors_are_400(start_server):
    from dualpath.runtime.model.loader import tiny_tokenizer

    no_template = tiny_tokenizer()
    no_template.chat_template = None  # apply_chat_template raises InputError
    strict = tiny_tokenizer()
    strict.chat_template = "{{ raise_exception('conversation roles must alternate') }}"
    for tokenizer, message in ((no_template, "no chat template"), (strict, "must alternate")):
        server = start_server(FakeBackend(tokenizer))
        response = httpx.post(server.url + CHAT, json={"messages": USER})
        assert response.status_code == 400 and response.json()["error"]["param"] == "messages"
        assert message in response.json()["error"]["message"]
        assert httpx.post(server.url + COMPLETIONS, json={"prompt": "hi", "max_tokens": 1}).status_code == 200


def test_router_failures_are_opaque_500s_and_stream_errors(start_server):
    class Broken(FakeBackend):
        async def _generate(self, request):
            async with contextlib.aclosing(super()._generate(request)) as events:
                async for event in events:
                    if event.index == 2:
                        raise RuntimeError("engine 3 vanished: secret internals")
                    yield event

    class BrokenAtStart(FakeBackend):
        async def _generate(self, request):
            raise RuntimeError("secret internals")
            yield  # an async generator

    server = start_server(BrokenAtStart())
    for stream in (False, True):
        response = httpx.post(server.url + CHAT, json={"messages": USER, "stream": stream})
        assert response.status_code == 500 and response.json()["error"]["type"] == "server_error"
        assert "secret" not in response.text and "Traceback" not in response.text
    server = start_server(Broken())
    assert httpx.post(server.url + CHAT, json={"messages": USER}).status_code == 500
    with httpx.stream("POST", server.url + CHAT, json={"messages": USER, "stream": True}) as response:
        assert response.status_code == 200  # the failure came after the first token
        lines = [line for line in response.iter_lines() if line]
    assert '"type":"server_error"' in lines[-2] and "secret" not in "".join(lines) and lines[-1] == "data: [DONE]"
    assert server.router.active_request_ids == frozenset()
