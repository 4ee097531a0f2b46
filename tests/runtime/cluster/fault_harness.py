"""Shared by the engine-fault tests: `dualpath serve`'s app on a real local cluster (tiny model) in
a background thread, greedy requests run on the router's own loop, and kills of engine processes
(os.kill on the pids the cluster knows) timed by what the router sees."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from typing import Any, Callable

import httpx
import uvicorn

from dualpath.config import EngineConfig, RuntimeConfig
from dualpath.config.overrides import set_fields
from dualpath.runtime.api import GenerationRequest, SamplingParams, ServiceUnavailable
from dualpath.runtime.apps.serve import make_app

# Long enough greedy answers that a kill lands mid-decode: the tiny model decodes ~1.5 ms a token
# here, so 600 tokens is ~1 s of decode per request.
GEN_TOKENS = 600
PROMPTS = [tuple(range(5 + i, 150 + 7 * i)) for i in range(4)]  # 145..166 tokens: 2 full blocks each
# A process exit is seen at once (router/liveness.py ExitWatch); the stream then ends within the
# router's handling and the server's next send: well under this bound on a loaded 2-core machine.
EXIT_BOUND_S = 3.0


def config(changes: dict[str, Any] | None = None, **top: Any) -> RuntimeConfig:
    """The faults' tiny cluster: top-level fields, then `changes` {section.field: value}."""
    engines = EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096)
    return set_fields(RuntimeConfig(model="tiny", engines=engines, **top), changes or {})


class Served:
    """The app and its cluster; `url` is the server's root."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        app, self.cluster = make_app(cfg)
        conf = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(conf)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 180
        while not self.server.started:
            assert self.thread.is_alive() and time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    @property
    def router(self) -> Any:
        return self.cluster.router

    def on_loop(self, fn: Callable[[], Any], timeout_s: float = 30.0) -> Any:
        """fn() on the router's event loop (its state changes only there)."""
        async def call() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(call(), self.router._loop).result(timeout_s)

    def run(self, coro: Any, timeout_s: float = 120.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.router._loop).result(timeout_s)

    def kill(self, engine: int, sig: int = signal.SIGKILL) -> None:
        os.kill(self.cluster.processes[engine].pid, sig)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


async def greedy(router: Any, i: int) -> list[int] | tuple[str, str, int]:
    """Request i's tokens, or ("error", message, tokens streamed before it)."""
    out: list[int] = []
    params = SamplingParams(max_tokens=GEN_TOKENS, temperature=0, ignore_eos=True, min_tokens=GEN_TOKENS)
    try:
        async for ev in router.generate(GenerationRequest(f"r{i}", PROMPTS[i], params)):
            assert ev.index == len(out), "the client's stream skipped or repeated an index"
            out.append(ev.token_id)
    except ServiceUnavailable as exc:
        return ("error", str(exc), len(out))
    return out


async def greedy_all(router: Any, fault: Callable[[], Any] | None = None) -> list:
    """Every prompt at once; `fault` (a coroutine function) runs beside them."""
    tasks = [asyncio.create_task(greedy(router, i)) for i in range(len(PROMPTS))]
    if fault is not None:
        await fault()
    return await asyncio.gather(*tasks)


async def first_decoding_de(router: Any, min_tokens: int = 20) -> tuple[int, set[int]]:
    """(a DE on which some request has streamed `min_tokens` tokens, the client streams on it)."""
    while True:
        for rr in list(router.requests.values()):
            if rr.de is not None and not rr.finished and len(rr.emitted) >= min_tokens:
                de = rr.de.engine
                return de, {r.stream_rid for r in router.requests.values() if r.de is not None and r.de.engine == de
                            and not r.finished}
        await asyncio.sleep(0.002)


def sse_until_error(url: str, body: dict, on_chunk: Callable[[int], None], timeout_s: float = 60.0) -> tuple[list, float]:
    """Stream a chat completion; on_chunk(n) after each content chunk. Returns (events, seconds from
    the last content chunk to the end of the stream)."""
    events, last = [], time.monotonic()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout_s) as r:
        assert r.status_code == 200
        n = 0
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            events.append(data if data == "[DONE]" else json.loads(data))
            if data != "[DONE]" and "choices" in events[-1] and events[-1]["choices"]:
                n += 1
                last = time.monotonic()
                on_chunk(n)
    return events, time.monotonic() - last
