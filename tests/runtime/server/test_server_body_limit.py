"""A body over the limit is a 413 with an OpenAI error body before any of it is parsed, whether
its size was declared (Content-Length) or not (chunked); bodies within the limit are unaffected."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import httpx
import pytest

from dualpath.runtime.server.admission import ServerLimits

LIMIT_BYTES = 2048
COMPLETIONS = "/v1/completions"


def body_of(num_bytes: int) -> bytes:
    """A valid completion request of exactly `num_bytes` bytes (the prompt pads it)."""
    head = json.dumps({"prompt": "", "max_tokens": 2}).encode()
    body = json.dumps({"prompt": "x" * (num_bytes - len(head)), "max_tokens": 2}).encode()
    assert len(body) == num_bytes
    return body


def chunked(body: bytes, chunk_bytes: int = 500):
    for start in range(0, len(body), chunk_bytes):
        yield body[start : start + chunk_bytes]


def assert_413(response: httpx.Response) -> None:
    assert response.status_code == 413
    error = response.json()["error"]
    assert error["code"] == "request_too_large" and str(LIMIT_BYTES) in error["message"]


@pytest.fixture
def server(start_server):
    return start_server(limits=ServerLimits(max_body_bytes=LIMIT_BYTES))


@pytest.mark.parametrize("declared", [True, False])
def test_body_over_the_limit_is_a_413_and_never_parsed(server, declared):
    body = body_of(LIMIT_BYTES + 1)
    with httpx.Client(base_url=server.url, timeout=5) as client:
        content = body if declared else chunked(body)
        response = client.post(COMPLETIONS, content=content, headers={"Content-Type": "application/json"})
        assert ("content-length" in response.request.headers) is declared
        assert_413(response)
        # not even a malformed body over the limit reaches the JSON parser (that would be a 400)
        junk = b"{" * (LIMIT_BYTES + 1)
        assert_413(client.post(COMPLETIONS, content=junk if declared else chunked(junk)))
    assert not server.router.received
    metrics = httpx.get(server.url + "/metrics").text
    assert 'dualpath_http_responses_total{code="413",route="/v1/completions"} 2.0' in metrics


@pytest.mark.parametrize("declared", [True, False])
def test_body_at_the_limit_is_served(server, declared):
    body = body_of(LIMIT_BYTES)
    content = body if declared else chunked(body)
    response = httpx.post(server.url + COMPLETIONS, content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "length"
    assert server.router.received[0].prompt_ids[-1] == ord("x")


def test_a_huge_declared_body_is_refused_before_it_is_sent(server):
    """With `Expect: 100-continue` the client waits for the server's go-ahead: a declared size over
    the limit gets the 413 without a byte of the body on the wire."""
    parts = urlsplit(server.url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 10000000000\r\nExpect: 100-continue\r\n\r\n")
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += sock.recv(65536)
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert not server.router.received
