"""`dualpath bench overload`: the server at its capacity and at 3x it: nothing lost, the excess refused
quickly (docs/results/overload/overload.json).

A real `dualpath serve` (its own process, with its engine processes) with an in-flight limit L
(`--inflight`: the server's `--max-inflight-requests`). The load comes from this process, streaming
/v1/completions of distinct prompts (token ids, so no prefix is shared and every request computes
its prompt).
  1. Capacity: C closed-loop clients (`--clients`, more than L; 2L by default) for CAPACITY_S, each
     sending its next request when the last one ends, or once a 429's Retry-After has passed. The
     capacity is measured at an offered concurrency above the limit, not at the concurrency the
     limit was set to: the server is held at its limit by its own admission whatever the clients'
     turnaround, and the refusals that costs are counted. The finished requests per second are
     the capacity, and their TTFT p90 is the TTFT at capacity.
  2. Overload: open-loop Poisson arrivals at OVERLOAD_FACTOR x the capacity for OVERLOAD_S. Excess
     requests must get a 429 (with Retry-After) quickly. Admitted ones must keep a TTFT p90 within
     1.5x of the one at capacity, and none may be lost: every request ends in 200 with all its
     tokens, or 429.
The load generator shares this machine's CPUs with the server, as a client on the same host would.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

CAPACITY_S = 20.0  # long enough for ~100s of requests on the tiny model
OVERLOAD_S = 20.0
WARMUP_S = 3.0  # a closed loop at the limit before the capacity phase (first forwards, connections)
CLIENTS_PER_LIMIT = 2  # the capacity phase's default offered concurrency: 2 x the in-flight limit
OVERLOAD_FACTOR = 3.0  # project choice: 3x the measured capacity, so admission must refuse most of the load
PROMPT_TOKENS = 128  # two 64-token blocks, computed (distinct prompts: nothing hits)
MAX_TOKENS = 8
START_TIMEOUT_S = 180.0
REQUEST_TIMEOUT_S = 120.0  # a request still open after this counts as lost


@dataclass(slots=True)
class Outcome:
    status: int  # HTTP status, 0: no response (lost)
    sent_s: float
    ttft_s: float  # first streamed token (200) or the response (429); -1: none
    tokens: int
    retry_after_s: float = -1.0  # a 429's Retry-After header; -1: none (not a 429, or no header)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: str, port: int, *args: str, log_path: Path | None = None) -> subprocess.Popen:
    """`dualpath serve` of `model` on `port` (and `args`) in its own process, its output in
    `log_path` (a temporary file by default, which `stop_server` removes after a clean exit: a pipe
    nobody reads would fill and stall the server)."""
    temporary = log_path is None
    log_path = log_path or Path(tempfile.mkstemp(prefix="dualpath-serve-", suffix=".log")[1])
    with open(log_path, "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([sys.executable, "-m", "dualpath.cli", "serve", "--model", model, "--port", str(port),
                                 *args], stdout=log, stderr=subprocess.STDOUT)
    proc.log_path = log_path  # type: ignore[attr-defined]  # wait_ready quotes it
    proc.log_is_temporary = temporary  # type: ignore[attr-defined]
    return proc


def stop_server(proc: subprocess.Popen) -> None:
    """SIGTERM (the server stops its engines), then SIGKILL after 60 s. A temporary log is removed
    when the server exited by the SIGTERM, kept (and named) otherwise."""
    proc.terminate()
    try:
        clean = proc.wait(timeout=60) in (0, -signal.SIGTERM)
    except subprocess.TimeoutExpired:
        proc.kill()
        clean = False
    log = getattr(proc, "log_path", None)
    if log is not None and getattr(proc, "log_is_temporary", False):
        if clean:
            Path(log).unlink(missing_ok=True)
        else:
            print(f"the server did not stop cleanly; its log: {log}", file=sys.stderr)


async def wait_ready(client: Any, base: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = getattr(proc, "log_path", None)
            raise RuntimeError(f"the server exited: {Path(log).read_text(errors='replace')[-2000:] if log else ''}")
        try:
            if (await client.get(f"{base}/health")).json().get("status") == "ok":
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the server did not become healthy")


async def one_request(client: Any, base: str, model: str, prompt: list[int], t0: float) -> Outcome:
    sent = time.perf_counter() - t0
    body = {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS, "stream": True,
            "temperature": 0, "ignore_eos": True, "stream_options": {"include_usage": True}}
    ttft, tokens = -1.0, 0
    try:
        async with client.stream("POST", f"{base}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
            if r.status_code != 200:
                await r.aread()
                retry_after_s = float(r.headers.get("Retry-After", -1))
                return Outcome(r.status_code, sent, time.perf_counter() - t0 - sent, 0, retry_after_s)
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if ttft < 0 and chunk.get("choices"):
                    ttft = time.perf_counter() - t0 - sent  # the first token's chunk
                if chunk.get("usage"):
                    tokens = int(chunk["usage"]["completion_tokens"])
            return Outcome(200, sent, ttft, tokens)
    except Exception:  # noqa: BLE001 - a timeout or a dropped connection: the request is lost
        return Outcome(0, sent, -1.0, tokens)


def _prompt(rng: random.Random, vocab: int) -> list[int]:
    return [rng.randrange(3, vocab) for _ in range(PROMPT_TOKENS)]


async def closed_loop(client: Any, base: str, model: str, clients: int, duration_s: float, vocab: int, seed: int) -> list[Outcome]:
    """`clients` workers for `duration_s`: each sends its next request when the last one ends, or
    after a 429's Retry-After (at most until the end), as a client that honours it does."""
    rng, t0, out = random.Random(seed), time.perf_counter(), []

    async def worker() -> None:
        while time.perf_counter() - t0 < duration_s:
            o = await one_request(client, base, model, _prompt(rng, vocab), t0)
            out.append(o)
            if o.status == 429:
                left_s = duration_s - (time.perf_counter() - t0)
                await asyncio.sleep(max(0.0, min(o.retry_after_s, left_s)))

    await asyncio.gather(*(worker() for _ in range(clients)))
    return out


async def open_loop(client: Any, base: str, model: str, rate_per_s: float, duration_s: float, vocab: int, seed: int) -> list[Outcome]:
    rng, t0, tasks = random.Random(seed), time.perf_counter(), []
    nxt = 0.0
    while nxt < duration_s:
        await asyncio.sleep(max(0.0, nxt - (time.perf_counter() - t0)))
        tasks.append(asyncio.create_task(one_request(client, base, model, _prompt(rng, vocab), t0)))
        nxt += rng.expovariate(rate_per_s)
    return list(await asyncio.gather(*tasks))


def summarise(outcomes: list[Outcome], duration_s: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    pct = lambda xs, q: float(np.percentile(xs, q)) if xs else float("nan")  # noqa: E731
    return {"requests": len(outcomes), "finished": len(ok), "refused_429": len(refused),
            "other_status": sorted({o.status for o in outcomes} - {200, 429, 0}),
            "refused_without_retry_after": sum(o.retry_after_s < 1 for o in refused),
            "lost": sum(o.status == 0 for o in outcomes), "short": sum(o.tokens != MAX_TOKENS for o in ok),
            "throughput_per_s": len(ok) / duration_s, "ttft_p50_s": pct([o.ttft_s for o in ok], 50),
            "ttft_p90_s": pct([o.ttft_s for o in ok], 90), "refusal_p99_s": pct([o.ttft_s for o in refused], 99)}


async def run_overload(model: str = "tiny", inflight: int = 8, clients: int | None = None, seed: int = 0,
                       capacity_s: float = CAPACITY_S, overload_s: float = OVERLOAD_S) -> dict[str, Any]:
    """Both phases (module docstring) against a server limited to `inflight` requests; the capacity
    phase offers `clients` (default CLIENTS_PER_LIMIT x inflight, which must exceed `inflight`)."""
    import httpx

    from ..runtime.model import load_model

    clients = CLIENTS_PER_LIMIT * inflight if clients is None else clients
    if clients <= inflight:
        raise ValueError(f"the capacity phase needs more clients than the in-flight limit: {clients} <= {inflight}")
    vocab = load_model(model, device="cpu").model.config.vocab_size
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(model, port, "--max-inflight-requests", str(inflight))
    try:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S) as client:
            await wait_ready(client, base, proc)
            await closed_loop(client, base, model, inflight, WARMUP_S, vocab, seed + 99)
            cap = summarise(await closed_loop(client, base, model, clients, capacity_s, vocab, seed), capacity_s)
            if not cap["finished"]:
                raise RuntimeError(f"no request finished at capacity: {cap}")
            rate = OVERLOAD_FACTOR * cap["throughput_per_s"]
            over = summarise(await open_loop(client, base, model, rate, overload_s, vocab, seed + 1), overload_s)
    finally:
        stop_server(proc)
    return {"model": model, "max_inflight_requests": inflight, "clients": clients, "prompt_tokens": PROMPT_TOKENS,
            "max_tokens": MAX_TOKENS, "cpus": len(os.sched_getaffinity(0)), "capacity": cap,
            "overload_rate_per_s": rate, "overload": over,
            "ttft_p90_over_capacity": over["ttft_p90_s"] / cap["ttft_p90_s"]}
