"""`dualpath bench salts`: does a cache salt close the side channel a shared KV store opens?
(docs/results/salts/).

A persistent KV store shared by tenants lets one probe what another sent: a hit is visibly faster
than a miss. With the prompt's blocks keyed under the request's `cache_salt` (core/blocks.py:
salted_root), the same prompt under another salt must cost what a cold prompt costs. Against a
real `dualpath serve`, one request at a time (so each TTFT is the request's own), for each of
`prompts` distinct prompts of `prompt_tokens` random token ids:

  1. cold: under salt A (nothing stored under any salt);
  2. another salt: the same prompt under salt B, once A's blocks are stored;
  3. hit: under salt A again.

Reported: the TTFT of each group (median, p10, p90), the cached tokens each request was told, and
whether the other salt's median lies within the cold requests' p10..p90 (no measurable difference)
while the hit's median is below the cold p10 (the difference the salt hides).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any

import numpy as np

from .overload import free_port, start_server, stop_server, wait_ready

GROUPS = ("cold", "other_salt", "hit")
PERSIST_WAIT_S = 60.0  # the longest we wait for salt A's blocks to be stored before the next two
REQUEST_TIMEOUT_S = 300.0


async def _ttft(client: Any, base: str, prompt: list[int], salt: str) -> tuple[float, int]:
    """(TTFT in seconds, cached tokens) of one streamed request of one token."""
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0, "stream": True, "cache_salt": salt,
            "stream_options": {"include_usage": True}}
    t0, first, cached = time.perf_counter(), -1.0, -1
    async with client.stream("POST", f"{base}/v1/completions", json=body, timeout=REQUEST_TIMEOUT_S) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode()[:500]}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if first < 0 and chunk.get("choices"):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return first, cached


async def _stored(client: Any, base: str, before: float, blocks: int) -> None:
    """Wait until the store has `blocks` more block writes than `before` (the server's counter)."""
    deadline = time.monotonic() + PERSIST_WAIT_S
    while time.monotonic() < deadline:
        if _persisted(await client.get(f"{base}/metrics")) >= before + blocks:
            return
        await asyncio.sleep(0.1)
    raise RuntimeError(f"salt A's {blocks} blocks were not stored within {PERSIST_WAIT_S:g} s")


def _persisted(metrics: Any) -> float:
    total = 0.0
    for line in metrics.text.splitlines():
        if line.startswith("dualpath_store_persisted_blocks_total"):
            total += float(line.split()[-1])
    return total


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per group: TTFT median, p10, p90 and cached tokens; the two judgements of the docstring."""
    out: dict[str, Any] = {}
    for g in GROUPS:
        ttfts = [r[g]["ttft_s"] for r in rows]
        out[g] = {"ttft_p50_s": float(np.median(ttfts)), "ttft_p10_s": float(np.percentile(ttfts, 10)),
                  "ttft_p90_s": float(np.percentile(ttfts, 90)), "cached_tokens": sorted({r[g]["cached"] for r in rows})}
    cold, other, hit = out["cold"], out["other_salt"], out["hit"]
    out["other_salt_over_cold"] = other["ttft_p50_s"] / cold["ttft_p50_s"]
    out["hit_over_cold"] = hit["ttft_p50_s"] / cold["ttft_p50_s"]
    out["other_salt_within_cold_spread"] = cold["ttft_p10_s"] <= other["ttft_p50_s"] <= cold["ttft_p90_s"]
    out["hit_below_cold_spread"] = hit["ttft_p50_s"] < cold["ttft_p10_s"]
    out["never_cached_across_salts"] = other["cached_tokens"] == [0] and cold["cached_tokens"] == [0]
    return out


async def run_salts(model: str = "smollm2-135m", prompts: int = 12, prompt_tokens: int = 1024, seed: int = 0,
                    block_tokens: int = 64) -> dict[str, Any]:
    import httpx

    from ..runtime.model import load_model

    vocab = load_model(model, device="cpu").model.config.vocab_size
    rng = random.Random(seed)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(model, port)
    rows: list[dict[str, Any]] = []
    try:
        async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S) as client:
            await wait_ready(client, base, proc)
            await _ttft(client, base, [rng.randrange(3, vocab) for _ in range(prompt_tokens)], "warm-up")
            for i in range(prompts):
                prompt = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
                before = _persisted(await client.get(f"{base}/metrics"))
                cold = await _ttft(client, base, prompt, f"A{i}")
                await _stored(client, base, before, prompt_tokens // block_tokens)
                other = await _ttft(client, base, prompt, f"B{i}")
                hit = await _ttft(client, base, prompt, f"A{i}")
                rows.append({g: {"ttft_s": t, "cached": c} for g, (t, c) in zip(GROUPS, (cold, other, hit))})
    finally:
        stop_server(proc)
    return {"model": model, "prompts": prompts, "prompt_tokens": prompt_tokens, "seed": seed, "rows": rows,
            "summary": summarise(rows)}


def plot_salts(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = {"cold": "cold (salt A)", "other_salt": "same prompt, salt B", "hit": "same prompt, salt A"}
    for x, g in enumerate(GROUPS):
        ys = [row[g]["ttft_s"] * 1e3 for row in r["rows"]]
        ax.scatter([x + (i - len(ys) / 2) * 0.01 for i in range(len(ys))], ys, s=14)
        ax.hlines(float(np.median(ys)), x - 0.25, x + 0.25, color="k")
    ax.set_xticks(range(len(GROUPS)), [labels[g] for g in GROUPS])
    ax.set_ylabel("TTFT, ms")
    ax.set_ylim(bottom=0)
    ax.set_title(f"{r['model']}: {r['prompt_tokens']}-token prompts, one request at a time")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
