"""The official `openai` client drives a multi-turn chat against `dualpath serve`'s app on a real
local cluster (tiny model, real engine processes): streaming works and the second turn reports
cached prompt tokens; a client that disconnects mid-stream frees its request on every engine."""

import time

import httpx
import openai
import pytest

from dualpath.config import EngineConfig, RuntimeConfig
from persist_wait import count_block_files, wait_block_files
from serve_thread import serve_in_thread


@pytest.fixture(scope="module")
def server():
    cfg = RuntimeConfig(model="tiny",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096))
    with serve_in_thread(cfg) as (url, cluster):
        yield url, cluster


def test_multi_turn_chat_with_streaming_and_cached_tokens(server):
    url, cluster = server
    client = openai.OpenAI(base_url=url, api_key="unused")
    user1 = "Tell me about the storage network of a prefill node, in detail please. " * 2
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": user1}],
                                            max_tokens=12, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    pieces, usage1 = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            usage1 = chunk.usage
    answer = "".join(pieces)
    assert usage1 is not None and usage1.completion_tokens >= 1
    # the decode engine persists the first turn's full blocks (at least the prompt's)
    wait_block_files(cluster.store.root, usage1.prompt_tokens // 64)
    messages = [{"role": "user", "content": user1}, {"role": "assistant", "content": answer},
                {"role": "user", "content": "And the decode node?"}]
    r2 = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    assert r2.usage.prompt_tokens > usage1.prompt_tokens
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= 64 and cached % 64 == 0 and cached <= usage1.prompt_tokens
    # our usage extension: the cached tokens by the read path that loaded them, the one the
    # router placed them on (its decision log: every hit of this cluster so far was this one)
    by_path = r2.usage.model_extra["dualpath"]["cached_tokens_by_path"]
    side = cluster.router.metrics.reqs[max(cluster.router.metrics.reqs)].side
    assert by_path == {"prefill": cached if side == 0 else 0, "decode": cached if side == 1 else 0}
    assert usage1.model_extra["dualpath"]["cached_tokens_by_path"] == {"prefill": 0, "decode": 0}
    # the router's own Prometheus families, scraped from the live cluster: idle queues, one
    # read-queue gauge per engine, the bytes the second turn read from storage
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert 'dualpath_queue_requests{queue="prefill"} 0.0' in text and 'dualpath_queue_requests{queue="placing"} 0.0' in text
    assert text.count("dualpath_read_queue_tokens{engine=") == 2
    read = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("dualpath_kv_load_bytes_total{"))
    assert read > 0
    loaded = {line.split('"')[1]: float(line.split()[-1]) for line in text.splitlines()
              if line.startswith("dualpath_kv_load_tokens_total{")}
    assert loaded == {"prefill": float(by_path["prefill"]), "decode": float(by_path["decode"])}


def test_a_prompt_under_another_cache_salt_never_hits(server):
    """cache_salt keys a prompt's blocks apart (core/blocks.py: salted_root) in the router's index
    and in the store: the same long prompt under another salt is computed from scratch, with the
    same answer; under its own salt again it hits."""
    url, cluster = server
    client = openai.OpenAI(base_url=url, api_key="unused")
    prompt = "The storage network of a decode node sits idle while the prefill side saturates. " * 4

    def ask(salt: str) -> tuple[int, str, int]:
        r = client.completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0,
                                      extra_body={"cache_salt": salt})
        return r.usage.prompt_tokens_details.cached_tokens, r.choices[0].text, r.usage.prompt_tokens

    before = count_block_files(cluster.store.root)
    cold, text, n = ask("tenant-a")
    assert cold == 0 and n >= 128
    assert wait_block_files(cluster.store.root, before + n // 64) >= before + n // 64  # tenant a's blocks stored
    other, other_text, _ = ask("tenant-b")
    assert other == 0 and other_text == text  # nothing of tenant a's, and the same tokens recomputed
    # tenant b's blocks are stored beside a's, under other keys
    assert wait_block_files(cluster.store.root, before + 2 * (n // 64)) >= before + 2 * (n // 64)
    again, again_text, _ = ask("tenant-a")
    assert again >= 64 and again % 64 == 0 and again_text == text


def test_returned_token_ids_sent_back_as_a_prompt_hit_every_full_block(server):
    """return_token_ids: the prompt's and the answer's ids; sent back as a token prompt (no text
    round trip to change them), every full block of what the cluster stored is a hit."""
    url, cluster = server
    body = {"model": "tiny", "prompt": "Token ids in, token ids out: an RL trainer's bookkeeping. " * 3,
            "max_tokens": 40, "temperature": 0, "min_tokens": 40, "return_token_ids": True}
    before = count_block_files(cluster.store.root)
    first = httpx.post(url + "/completions", json=body, timeout=60).json()
    choice = first["choices"][0]
    ids = choice["prompt_token_ids"] + choice["token_ids"]
    assert len(choice["token_ids"]) == 40 and len(choice["prompt_token_ids"]) == first["usage"]["prompt_tokens"]
    stored = (len(ids) - 1) // 64  # every block whose tokens all have KV (the last token's is not computed)
    assert wait_block_files(cluster.store.root, before + stored) >= before + stored
    again = httpx.post(url + "/completions", json=body | {"prompt": ids, "max_tokens": 2, "min_tokens": 0},
                       timeout=60).json()
    assert again["choices"][0]["prompt_token_ids"] == ids
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 64 * stored


def test_disconnect_mid_stream_frees_the_request(server):
    url, cluster = server
    client = openai.OpenAI(base_url=url, api_key="unused")
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "count " * 40}],
                                            max_tokens=400, extra_body={"min_tokens": 400, "ignore_eos": True},
                                            temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 3:
            break
    stream.close()
    router = cluster.router
    deadline = time.monotonic() + 30
    while router.requests and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not router.requests, "the cancelled request still holds router state"
    assert all(e.num_seqs == 0 and e.kv_reserved_tokens == 0 for e in router.engines.values()), [(e.engine, e.num_seqs, e.num_tokens, e.kv_reserved_tokens, e.read_queue_tokens) for e in router.engines.values()]
