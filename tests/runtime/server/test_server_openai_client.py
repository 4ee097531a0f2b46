"""The official `openai` client against a real uvicorn server over the FakeBackend."""

from __future__ import annotations

import openai
import pytest

from dualpath.runtime.server.fake_backend import DEFAULT_REPLY_TEXT, FakeBackend

MODEL = "dualpath-fake"


@pytest.fixture
def served(start_server):
    server = start_server(api_key="secret")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="secret", max_retries=0, timeout=10)
    yield server, client
    client.close()


def test_chat_completion(served):
    server, client = served
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}], seed=3,
                                           temperature=0.5, top_p=0.9)
    assert reply.object == "chat.completion" and reply.model == MODEL and reply.id.startswith("chatcmpl-")
    assert reply.created == 1_700_000_000
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == DEFAULT_REPLY_TEXT
    assert choice.finish_reason == "stop"  # the script ended with EOS, which is not part of the text
    prompt_ids = server.router.tokenizer.encode(
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n", allow_added_tokens=True)
    completion_ids = len(server.router.tokenizer.encode(DEFAULT_REPLY_TEXT)) + 1  # + EOS
    usage = reply.usage
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(prompt_ids), completion_ids)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens == 0
    sent = server.router.received[-1]
    assert sent.prompt_ids == tuple(prompt_ids) and sent.request_id == reply.id
    assert (sent.params.seed, sent.params.temperature, sent.params.top_p) == (3, 0.5, 0.9)
    assert sent.params.max_tokens == server.router.max_context_tokens - len(prompt_ids)  # default: the rest
    assert server.router.active_request_ids == frozenset()  # closed before the response was sent


def test_chat_stream_with_usage(served):
    server, client = served
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi!"}],
                                            max_completion_tokens=20, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == DEFAULT_REPLY_TEXT[:20] and reasons == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 20
    assert all(c.usage is None for c in chunks[:-1])
    assert server.router.received[-1].params.max_tokens == 20
    assert server.router.active_request_ids == frozenset() and server.router.num_finished == 1


def test_second_turn_reports_cached_prompt_tokens(served):
    server, client = served
    # long enough that the first turn's prompt fills whole 64-token blocks
    first = [{"role": "system", "content": "You are a terse assistant. " * 4},
             {"role": "user", "content": "Tell me about prefix caching in agentic workloads."}]
    reply1 = client.chat.completions.create(model=MODEL, messages=first)
    assert reply1.usage.prompt_tokens_details.cached_tokens == 0
    second = [*first, {"role": "assistant", "content": reply1.choices[0].message.content},
              {"role": "user", "content": "And with two read paths?"}]
    reply2 = client.chat.completions.create(model=MODEL, messages=second)
    cached = reply2.usage.prompt_tokens_details.cached_tokens
    assert cached > 0 and cached % 64 == 0
    # the first turn's prompt + answer + EOS are all a prefix of the second prompt
    assert cached >= (reply1.usage.total_tokens // 64) * 64
    assert cached < reply2.usage.prompt_tokens


def test_completion_with_token_ids_and_forced_length(served):
    server, client = served
    prompt = [72, 105, 33]  # "Hi!" in the byte-level tiny tokenizer
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=80,
                                      extra_body={"min_tokens": 80, "ignore_eos": True})
    assert reply.object == "text_completion" and reply.id.startswith("cmpl-")
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage.prompt_tokens == 3 and reply.usage.completion_tokens == 80  # past the script's EOS
    sent = server.router.received[-1]
    assert sent.prompt_ids == tuple(prompt)
    assert (sent.params.max_tokens, sent.params.min_tokens, sent.params.ignore_eos) == (80, 80, True)
    assert reply.choices[0].text.startswith(DEFAULT_REPLY_TEXT)


def test_completion_stream_text_prompt(served):
    _, client = served
    chunks = list(client.completions.create(model=MODEL, prompt="Say hello", max_tokens=5, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == "Hello"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_models_and_bad_key(served):
    server, client = served
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
    assert error.value.param == "model"


def test_router_input_error_is_a_400(start_server):
    def reject(_prompt):
        from dualpath.errors import InputError

        raise InputError("prompt needs more KV blocks than the cluster has")

    server = start_server(FakeBackend(reply=reject))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError, match="more KV blocks"):
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=stream)
    assert server.router.active_request_ids == frozenset()


def test_concurrent_streams_do_not_mix(start_server):
    from concurrent.futures import ThreadPoolExecutor

    server = start_server(FakeBackend(token_delay_s=0.002))
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)

    def run(num_tokens: int) -> tuple[str, set[str], int]:
        stream = client.completions.create(model=MODEL, prompt="x", max_tokens=num_tokens, stream=True,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        return text, {c.id for c in chunks}, chunks[-1].usage.completion_tokens

    lengths = [5, 9, 13, 17, 21, 25]
    with ThreadPoolExecutor(len(lengths)) as pool:
        results = list(pool.map(run, lengths))
    for n, (text, ids, completion_tokens) in zip(lengths, results):
        assert text == DEFAULT_REPLY_TEXT[:n] and len(ids) == 1 and completion_tokens == n
    assert len({next(iter(ids)) for _, ids, _ in results}) == len(lengths)
    assert server.router.active_request_ids == frozenset()
