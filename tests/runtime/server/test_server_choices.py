"""OpenAI's `n` through the server (FakeBackend: every choice follows the script): a choice per
index with its own text, finish reason and logprobs; the prompt counted once in usage; streamed
chunks tagged by index, each choice opening with its role and closing with its finish reason; a
choice its stop string ends stops alone."""

from __future__ import annotations

import collections


from dualpath.runtime.server.fake_backend import DEFAULT_REPLY_TEXT

MODEL = "dualpath-fake"


def test_n_choices_not_streamed(served):
    server, client = served
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=3,
                                           max_tokens=8, logprobs=True)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert all(c.message.content == DEFAULT_REPLY_TEXT[:8] and c.finish_reason == "length" for c in reply.choices)
    assert all(len(c.logprobs.content) == 8 for c in reply.choices)
    one = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
    assert reply.usage.prompt_tokens == one.usage.prompt_tokens  # the prompt once
    assert reply.usage.completion_tokens == 3 * one.usage.completion_tokens == 24
    assert server.router.received[0].params.n == 3


def test_n_choices_streamed_by_index(served):
    server, client = served
    texts, reasons, roles = collections.defaultdict(str), {}, []
    for chunk in client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], n=2,
                                                max_tokens=6, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.index)
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                reasons[c.index] = c.finish_reason
        if chunk.usage is not None:
            assert chunk.usage.completion_tokens == 12
    assert roles == [0, 1] and dict(texts) == {0: DEFAULT_REPLY_TEXT[:6], 1: DEFAULT_REPLY_TEXT[:6]}
    assert reasons == {0: "length", 1: "length"}


def test_completions_n_with_a_stop_string(served):
    _, client = served
    reply = client.completions.create(model=MODEL, prompt="Hi", n=2, max_tokens=20, stop=["fake"])
    assert [(c.index, c.text, c.finish_reason) for c in reply.choices] == [(0, "Hello from the ", "stop"),
                                                                          (1, "Hello from the ", "stop")]
