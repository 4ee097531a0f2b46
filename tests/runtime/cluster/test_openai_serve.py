"""The official `openai` client drives a multi-turn chat against `dualpath serve`'s app on a real
local cluster (tiny model, real engine processes): streaming works and the second turn reports
cached prompt tokens; a client that disconnects mid-stream frees its request on every engine."""

import threading
import time

import httpx
import openai
import pytest
import uvicorn

from dualpath.config import EngineConfig, RuntimeConfig
from dualpath.runtime.apps.serve import make_app
from persist_wait import wait_block_files


@pytest.fixture(scope="module")
def server():
    cfg = RuntimeConfig(model="tiny",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096))
    app, cluster = make_app(cfg)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 180
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}/v1", cluster
    srv.should_exit = True
    thread.join(timeout=60)


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
    # the router's own Prometheus families, scraped from the live cluster: idle queues, one
    # read-queue gauge per engine, the bytes the second turn read from storage
    text = httpx.get(url.removesuffix("/v1") + "/metrics").text
    assert 'dualpath_queue_requests{queue="prefill"} 0.0' in text and 'dualpath_queue_requests{queue="placing"} 0.0' in text
    assert text.count("dualpath_read_queue_tokens{engine=") == 2
    read = sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("dualpath_storage_read_bytes_total{"))
    assert read > 0


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
