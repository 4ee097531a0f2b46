"""Logprobs in the OpenAI shapes, read with the official `openai` client over the FakeBackend
(its made-up logprobs: `fake_logprobs`): chat's `content` entries and completions' parallel
lists, streaming equal to not, every token's entry sent even where its text is held back (a
token holding part of a UTF-8 character), and the refusals. The values against a real model:
tests/runtime/cluster/test_served_logprobs.py."""

from __future__ import annotations

import math

import httpx
import pytest

from dualpath.runtime.server.fake_backend import DEFAULT_REPLY_TEXT

MODEL = "dualpath-fake"
REPLY = DEFAULT_REPLY_TEXT.encode()  # the tiny tokenizer: one token per byte, so "ï" is two tokens


def _expected(tokenizer, i: int, token: int, top: int) -> tuple[float, list[tuple[bytes, float]]]:
    logprob = -math.log(i + 2)
    return logprob, [(tokenizer.token_bytes(token + j), logprob - j) for j in range(top)]


def test_chat_logprobs_streaming_and_not(served):
    server, client = served
    tok = server.router.tokenizer
    body = dict(model=MODEL, messages=[{"role": "user", "content": "Hi!"}], max_tokens=len(REPLY), logprobs=True,
                top_logprobs=3)
    reply = client.chat.completions.create(**body)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == len(REPLY)
    assert b"".join(bytes(e.bytes) for e in content) == REPLY  # every byte, the split characters' too
    for i, (entry, byte) in enumerate(zip(content, REPLY)):
        logprob, top = _expected(tok, i, byte, 3)
        assert entry.logprob == pytest.approx(logprob) and entry.token == bytes([byte]).decode(errors="replace")
        assert [(bytes(t.bytes), t.logprob) for t in entry.top_logprobs] == [(b, pytest.approx(v)) for b, v in top]
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **body):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]


def test_completion_logprobs_lists_and_offsets(served):
    server, client = served
    tok = server.router.tokenizer
    n = 12  # "Hello from t": ASCII, one character per token
    reply = client.completions.create(model=MODEL, prompt="Hi", max_tokens=n, logprobs=2)
    lp = reply.choices[0].logprobs
    assert lp.tokens == list(DEFAULT_REPLY_TEXT[:n])
    assert lp.token_logprobs == pytest.approx([-math.log(i + 2) for i in range(n)])
    assert lp.text_offset == list(range(n))
    for i, (top, byte) in enumerate(zip(lp.top_logprobs, REPLY)):
        # the 2 most likely (the sampled one is the first of them here), as OpenAI's up to logprobs + 1
        want = {b.decode(errors="replace"): v for b, v in _expected(tok, i, byte, 2)[1]}
        assert top == pytest.approx(want)
    chunks = list(client.completions.create(model=MODEL, prompt="Hi", max_tokens=n, logprobs=2, stream=True))
    offsets = [o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset]
    assert offsets == lp.text_offset  # continued across chunks
    assert [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens] == lp.tokens


def test_logprobs_zero_and_none(served):
    server, client = served
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                           logprobs=True)
    assert [e.top_logprobs for e in reply.choices[0].logprobs.content] == [[], [], []]
    assert server.router.received[-1].params.logprobs == 0
    plain = client.completions.create(model=MODEL, prompt="Hi", max_tokens=3)
    assert plain.choices[0].logprobs is None and server.router.received[-1].params.logprobs == -1
    zero = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, logprobs=0)
    assert zero.choices[0].logprobs.top_logprobs == [{"H": pytest.approx(-math.log(2))},
                                                     {"e": pytest.approx(-math.log(3))}]


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # needs logprobs: true
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),  # a bool on chat
    ("/v1/completions", {"logprobs": True}, "logprobs"),  # an int on completions
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
])
def test_bad_logprobs_are_a_400_naming_the_field(served, path, body, param):
    server, _ = served
    base = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    r = httpx.post(server.url + path, json=base | body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert server.router.received == []
