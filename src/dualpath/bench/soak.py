"""`dualpath bench soak`: a real `dualpath serve` held at about 70% of its measured capacity for a
long time, with the mix its clients send (docs/results/soak/).

  1. Capacity: `clients` closed-loop clients send the mix's complete requests for `capacity_s`;
     the finished requests per second are the capacity.
  2. Soak: open-loop Poisson arrivals at LOAD_FRACTION x the capacity for `minutes`. Each request is
     one of `MIX` (soak_clients.py, seeded): streamed or not, with logprobs or not, with CHOICES
     choices (`n`) or one, under one of a few cache salts (tenants), continuing one of a few
     conversations (so later turns hit the store), or a client that disconnects mid-stream or
     gives up before the answer. Every `sample_s` (a minute by
     default): responses by status, TTFT and TPOT percentiles of the minute's requests, and the
     resident memory and open file descriptors of the server's process tree (the server and its
     engine processes, read from /proc).
  3. Drain: every request has ended; the server's own gauge of requests in flight must read 0.

Checks (`checks` in the JSON): no 5xx response; no request lost (every one ends in a status, a
complete answer, or its own client's abort); every 200 complete (all its tokens, and its logprobs
when asked); no cached token across salts (a conversation's first request under a salt it never
used finds nothing cached); RSS at the end within RSS_GROWTH_LIMIT of the sample at
RSS_BASELINE_MINUTE; no growth in open file descriptors beyond FD_SLACK.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from .overload import free_port, start_server, stop_server, wait_ready
from .soak_clients import (CHOICES, COMPLETE_KINDS, CONTEXT_LIMIT_TOKENS, MAX_TOKENS, MIX, REQUEST_TIMEOUT_S, TOP_LOGPROBS,
                           Clients, Outcome)

LOAD_FRACTION = 0.7  # the soak load: about 70% of the measured capacity
RSS_BASELINE_MINUTE = 5  # the issue's baseline: RSS at the end within 5% of minute 5's
RSS_GROWTH_LIMIT = 0.05
FD_SLACK = 8  # sockets of requests in flight at a sample come and go; a leak grows without bound
CAPACITY_S = 30.0
WARMUP_S = 5.0


def process_tree(root_pid: int) -> list[int]:
    """`root_pid` and its descendants, from /proc/*/stat's parent ids."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2:].split()[1])
    tree, frontier = [root_pid], [root_pid]
    while frontier:
        frontier = [p for p, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


def tree_usage(root_pid: int) -> tuple[int, int, int]:
    """(resident bytes, of them not shared, open file descriptors) summed over the process tree.
    Resident memory counts the shared host buffers once per process that maps them; the private
    part is where a leak shows."""
    rss, private, fds, page = 0, 0, 0, os.sysconf("SC_PAGE_SIZE")
    for pid in process_tree(root_pid):
        try:
            resident, shared = (int(v) for v in Path(f"/proc/{pid}/statm").read_text().split()[1:3])
            rss, private = rss + resident * page, private + (resident - shared) * page
            fds += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
    return rss, private, fds

def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def window_row(outcomes: list[Outcome], t_from: float, t_to: float, rss: int, private: int, fds: int) -> dict[str, Any]:
    """The requests sent in [t_from, t_to): statuses, TTFT and TPOT; the tree's memory at t_to."""
    part = [o for o in outcomes if t_from <= o.sent_s < t_to]
    statuses: dict[str, int] = {}
    for o in part:
        key = "lost" if o.lost else ("aborted" if o.status == 0 else str(o.status))
        statuses[key] = statuses.get(key, 0) + 1
    streamed = [o for o in part if o.complete and o.kind.startswith("stream") and not o.kind.endswith("_n")]
    return {"t_s": t_to, "requests": len(part), "statuses": statuses,
            "ttft_p50_s": _pct([o.ttft_s for o in streamed], 50), "ttft_p90_s": _pct([o.ttft_s for o in streamed], 90),
            "tpot_p50_s": _pct([o.tpot_s for o in streamed if o.tpot_s >= 0], 50),
            "rss_bytes": rss, "private_bytes": private, "open_fds": fds}


def checks(outcomes: list[Outcome], samples: list[dict[str, Any]], sample_s: float, inflight_after: float) -> dict[str, Any]:
    """The soak's pass conditions (module docstring), each with the values it was judged on."""
    by_status: dict[str, int] = {}
    for o in outcomes:
        key = "lost" if o.lost else ("aborted" if o.status == 0 else str(o.status))
        by_status[key] = by_status.get(key, 0) + 1
    ok = [o for o in outcomes if o.status == 200]
    base = samples[min(len(samples) - 1, int(round(RSS_BASELINE_MINUTE * 60 / sample_s)))]
    end = samples[-1]
    fds_min = min(s["open_fds"] for s in samples)
    out = {
        "responses_5xx": sum(v for k, v in by_status.items() if k.startswith("5")),
        "lost": by_status.get("lost", 0),
        "incomplete_200": sum(not o.complete for o in ok if o.kind in COMPLETE_KINDS),
        "cached_across_salts": sum(o.cached_tokens > 0 for o in ok if o.fresh_salt),
        "first_turns_under_a_new_salt": sum(o.fresh_salt and o.status == 200 for o in outcomes),
        "hits_under_the_same_salt": sum(o.cached_tokens > 0 for o in ok),
        "server_inflight_after_drain": inflight_after,
        "rss_baseline_bytes": base["rss_bytes"], "rss_end_bytes": end["rss_bytes"],
        "rss_end_over_baseline": end["rss_bytes"] / base["rss_bytes"],
        "private_end_over_baseline": end["private_bytes"] / max(1, base["private_bytes"]),
        "open_fds_baseline": base["open_fds"], "open_fds_end": end["open_fds"], "open_fds_min": fds_min,
        "by_status": by_status,
    }
    out["passed"] = (out["responses_5xx"] == 0 and out["lost"] == 0 and out["incomplete_200"] == 0
                     and out["cached_across_salts"] == 0 and inflight_after == 0
                     and out["rss_end_over_baseline"] <= 1 + RSS_GROWTH_LIMIT and end["open_fds"] <= base["open_fds"] + FD_SLACK)
    return out


def _inflight(metrics_text: str) -> float:
    for line in metrics_text.splitlines():
        if line.startswith("dualpath_server_inflight_requests "):
            return float(line.split()[-1])
    raise RuntimeError("the server's /metrics has no dualpath_server_inflight_requests")


async def run_soak(model: str = "smollm2-135m", minutes: float = 30.0, sample_s: float = 60.0, clients: int = 4,
                   capacity_s: float = CAPACITY_S, seed: int = 0, log_path: Path | None = None,
                   context_limit_tokens: int = CONTEXT_LIMIT_TOKENS) -> dict[str, Any]:
    """The three phases of the module docstring against a `dualpath serve` of its own (its log in
    `log_path`, default a temporary file)."""
    import httpx

    from ..runtime.model import load_model

    vocab = load_model(model, device="cpu").model.config.vocab_size
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = start_server(model, port, log_path=log_path)
    samples: list[dict[str, Any]] = []
    try:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        async with httpx.AsyncClient(limits=limits, timeout=REQUEST_TIMEOUT_S) as client:
            await wait_ready(client, base, proc)
            warm = Clients(client, base, vocab, seed + 99, COMPLETE_KINDS)
            await warm.closed_loop(clients, WARMUP_S)
            measure = Clients(client, base, vocab, seed + 1, COMPLETE_KINDS)
            capacity = await measure.closed_loop(clients, capacity_s)
            if capacity <= 0:
                raise RuntimeError("no request finished while measuring the capacity")
            soak = Clients(client, base, vocab, seed, context_limit_tokens=context_limit_tokens)
            rate = LOAD_FRACTION * capacity
            last = [0.0]

            def sample() -> None:
                now = time.perf_counter() - soak.t0
                samples.append(window_row(soak.outcomes, last[0], now, *tree_usage(proc.pid)))
                last[0] = now

            await soak.open_loop(rate, minutes * 60.0, sample, sample_s)
            inflight = _inflight((await client.get(f"{base}/metrics")).text)
    finally:
        stop_server(proc)
    return {"model": model, "minutes": minutes, "sample_s": sample_s, "cpus": len(os.sched_getaffinity(0)),
            "capacity_clients": clients, "capacity_per_s": capacity, "load_fraction": LOAD_FRACTION,
            "rate_per_s": rate, "mix": MIX, "max_tokens": MAX_TOKENS, "top_logprobs": TOP_LOGPROBS, "choices": CHOICES,
            "samples": samples, "checks": checks(soak.outcomes, samples, sample_s, inflight),
            "outcomes": [asdict(o) for o in soak.outcomes]}


def plot_soak(r: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = r["samples"][1:]
    t_min = [s["t_s"] / 60 for s in rows]
    fig, (lat, mem) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    lat.plot(t_min, [s["ttft_p50_s"] * 1e3 for s in rows], label="TTFT p50")
    lat.plot(t_min, [s["ttft_p90_s"] * 1e3 for s in rows], label="TTFT p90")
    lat.plot(t_min, [s["tpot_p50_s"] * 1e3 for s in rows], label="TPOT p50")
    lat.set_ylabel("ms (streamed requests)")
    lat.legend()
    lat.set_title(f"soak: {r['model']} at {r['rate_per_s']:.2f} req/s ({r['load_fraction']:.0%} of capacity)")
    mem.plot(t_min, [s["rss_bytes"] / 2**20 for s in rows], color="C3", label="RSS")
    mem.plot(t_min, [s["private_bytes"] / 2**20 for s in rows], color="C1", label="of it not shared")
    mem.set_ylabel("server tree memory, MiB")
    mem.legend(loc="lower left")
    fds = mem.twinx()
    fds.plot(t_min, [s["open_fds"] for s in rows], color="C4", label="open fds")
    fds.set_ylabel("open file descriptors")
    mem.set_xlabel("minutes")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
