"""Incremental detokenization and stop strings, alone and through the server's SSE stream."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from dualpath.runtime.server.fake_backend import FakeBackend
from dualpath.runtime.server.detokenize import IncrementalDetokenizer, StopStrings

MULTIBYTE_TEXT = "naïve café — 日本語 🙂👍🏽 done"


def stream_deltas(detokenizer: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    deltas = [detokenizer.push(i) for i in ids]
    return [*deltas, detokenizer.flush()]


def test_deltas_never_split_a_character(tokenizer):
    ids = tokenizer.encode(MULTIBYTE_TEXT)
    assert len(ids) == len(MULTIBYTE_TEXT.encode())  # one token per byte: every non-ASCII char is split
    deltas = stream_deltas(IncrementalDetokenizer(tokenizer), ids)
    assert "".join(deltas) == MULTIBYTE_TEXT == tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "🙂" in deltas  # four tokens, released whole on the fourth


def test_deltas_with_real_bpe_tokens_holding_partial_characters(smollm2_tokenizer):
    tok = smollm2_tokenizer
    ids = tok.encode(MULTIBYTE_TEXT)
    assert any("\ufffd" in tok.decode([i]) for i in ids)  # tokens that hold part of a character
    deltas = stream_deltas(IncrementalDetokenizer(tok), [*ids, tok.eos_token_id])
    assert "".join(deltas) == MULTIBYTE_TEXT and not any("\ufffd" in d for d in deltas)


def test_server_stream_with_smollm2_tokenizer(start_server, smollm2_tokenizer):
    tok = smollm2_tokenizer
    server = start_server(FakeBackend(tok, reply=lambda _prompt: tok.encode(MULTIBYTE_TEXT)))
    body = {"messages": [{"role": "user", "content": "Grüße 🙂"}], "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
        events = sse_events(response)
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events]
    assert "".join(deltas) == MULTIBYTE_TEXT and not any("\ufffd" in d for d in deltas)
    expected_prompt = tok.encode(tok.apply_chat_template(body["messages"]), allow_added_tokens=True)
    assert server.router.received[0].prompt_ids == tuple(expected_prompt)
    assert expected_prompt.count(tok.encode("<|im_start|>")[0]) == 3  # system, user, assistant: specials


def test_special_tokens_are_dropped_and_invalid_bytes_flushed(tokenizer):
    im_end, eos = tokenizer.encode("<|im_end|>")[0], tokenizer.eos_token_id
    ids = [*tokenizer.encode("a é"), im_end, *tokenizer.encode("日"), eos, 0xE6, 0x97]  # ends mid-character
    deltas = stream_deltas(IncrementalDetokenizer(tokenizer), ids)
    assert "".join(deltas) == tokenizer.decode(ids, skip_special=True) == "a é日\ufffd"
    assert "\ufffd" not in "".join(deltas[:-1])  # the broken tail shows up only on flush


def test_random_valid_texts_roundtrip(tokenizer):
    rng = random.Random(7)
    alphabet = "ab é€日𝄞🙂\n"
    for _ in range(50):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        deltas = stream_deltas(IncrementalDetokenizer(tokenizer), tokenizer.encode(text))
        assert "".join(deltas) == text and not any("\ufffd" in d for d in deltas)


@pytest.mark.parametrize(
    ("pieces", "stops", "expected", "stopped"),
    [
        (["Hel", "lo wo", "rld"], ("o w",), "Hell", True),
        (["ab", "c", "d"], ("cd", "bc"), "a", True),  # the earliest match wins
        (["ab", "c"], ("cx",), "abc", False),  # held-back "c" is released at the end
        (["stop"], ("stop",), "", True),
        (["abc"], (), "abc", False),
    ],
)
def test_stop_strings(pieces, stops, expected, stopped):
    filt = StopStrings(stops)
    out = "".join(filt.feed(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces) if not filt.stopped)
    assert (out, filt.stopped) == (expected, stopped)


def sse_events(response: httpx.Response) -> list[dict]:
    events = [line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_server_stream_concatenates_to_full_text(start_server, tokenizer):
    reply_ids = tokenizer.encode(MULTIBYTE_TEXT)
    server = start_server(FakeBackend(reply=lambda _prompt: reply_ids))
    body = {"messages": [{"role": "user", "content": "x"}], "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    deltas = [e["choices"][0]["delta"].get("content") for e in events]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(d for d in deltas if d) == MULTIBYTE_TEXT
    assert not any("\ufffd" in d for d in deltas if d)
    assert len([d for d in deltas if d]) < len(reply_ids)  # bytes of a character travel together
    assert events[-1]["choices"][0] == {"index": 0, "logprobs": None, "finish_reason": "stop", "delta": {}}
    assert {e["id"] for e in events} == {events[0]["id"]} and events[0]["object"] == "chat.completion.chunk"
    assert server.router.active_request_ids == frozenset()  # closed before [DONE] was sent


def test_server_stop_string_ends_generation(start_server, tokenizer):
    server = start_server(FakeBackend(reply=lambda _prompt: tokenizer.encode(MULTIBYTE_TEXT)))
    body = {"prompt": "x", "max_tokens": 200, "stop": ["日本", "never"]}
    reply = httpx.post(server.url + "/v1/completions", json=body).json()
    assert reply["choices"][0]["text"] == "naïve café — "
    assert reply["choices"][0]["finish_reason"] == "stop"
    # generation stopped at the token that completed the stop string, and the request was closed
    assert reply["usage"]["completion_tokens"] == len(tokenizer.encode("naïve café — 日本"))
    assert server.router.active_request_ids == frozenset()
    body["stream"] = True
    with httpx.stream("POST", server.url + "/v1/completions", json=body) as response:
        events = sse_events(response)
    assert "".join(e["choices"][0]["text"] for e in events) == "naïve café — "
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    assert server.router.active_request_ids == frozenset()
    assert len(server.router.cancelled_request_ids) == 2  # both closed at the stop string, before max_tokens


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_return_token_ids_gives_the_prompts_and_every_generated_token_streaming_or_not(start_server, tokenizer, route):
    """vLLM's `return_token_ids`: `prompt_token_ids` (top level on chat, in the choice on
    completions) are the ids the backend received; `token_ids` every generated id in order, streamed
    too, even the tokens whose text is held back (the bytes of a character travel together)."""
    reply_ids = tokenizer.encode(MULTIBYTE_TEXT)
    server = start_server(FakeBackend(reply=lambda _prompt: reply_ids))
    body = ({"prompt": "x y"} if route == "/v1/completions" else {"messages": [{"role": "user", "content": "x y"}]})
    body |= {"max_tokens": len(reply_ids), "return_token_ids": True}
    reply = httpx.post(server.url + route, json=body).json()
    sent = list(server.router.received[-1].prompt_ids)
    choice = reply["choices"][0]
    assert (reply if route == "/v1/chat/completions" else choice)["prompt_token_ids"] == sent
    assert choice["token_ids"] == reply_ids
    with httpx.stream("POST", server.url + route, json=body | {"stream": True}) as response:
        events = sse_events(response)
    streamed = [i for e in events for i in e["choices"][0]["token_ids"]]
    assert streamed == reply_ids
    carriers = [e if route == "/v1/chat/completions" else e["choices"][0] for e in events]
    assert [("prompt_token_ids" in c) for c in carriers] == [True] + [False] * (len(events) - 1)
    assert carriers[0]["prompt_token_ids"] == list(server.router.received[-1].prompt_ids)
    plain = httpx.post(server.url + route, json={k: v for k, v in body.items() if k != "return_token_ids"}).json()
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain | plain["choices"][0]
