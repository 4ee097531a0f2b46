"""`dualpath bench soak`: a real `dualpath serve` held at about 70% of its measured capacity for a
long time, with the mix its clients send (docs/results/soak/).

  1. Capacity: `clients` closed-loop clients send the mix's complete requests for `capacity_s`;
     the finished requests per second are the capacity.
  2. Soak: open-loop Poisson arrivals at LOAD_FRACTION x the capacity for `minutes`. Each request is
     one of `MIX` (seeded): streamed or not, with logprobs or not, with CHOICES choices (`n`) or
     one, under one of a few cache salts
     (tenants), continuing one of a few conversations (so later turns hit the store), or a client
     that disconnects mid-stream or gives up before the answer. Every `sample_s` (a minute by
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

import asyncio
import json
import os
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .overload import free_port, wait_ready

LOAD_FRACTION = 0.7  # the soak load: about 70% of the measured capacity
RSS_BASELINE_MINUTE = 5  # the issue's baseline: RSS at the end within 5% of minute 5's
RSS_GROWTH_LIMIT = 0.05
FD_SLACK = 8  # sockets of requests in flight at a sample come and go; a leak grows without bound
CAPACITY_S = 30.0
WARMUP_S = 5.0
MAX_TOKENS = 16  # forced (min_tokens = max_tokens), so a complete answer has exactly this many tokens
APPEND_TOKENS = (48, 160)  # each turn's new prompt tokens, uniform in this range
CONTEXT_LIMIT_TOKENS = 1536  # a conversation longer than this starts over (new salt turn, new prefix)
CONVERSATIONS = 6
SALTS = ("tenant-a", "tenant-b", "tenant-c")
TOP_LOGPROBS = 2
CHOICES = 3  # the `n` of the mix's *_n kinds
DISCONNECT_AFTER_CHUNKS = 3
CANCEL_AFTER_S = 0.05  # a client that gives up this soon after sending, before its answer
REQUEST_TIMEOUT_S = 300.0  # a request still open after this counts as lost

# kind -> weight: what the soak's clients send
MIX = {"stream": 3, "plain": 2, "stream_logprobs": 2, "plain_logprobs": 1, "stream_n": 1, "plain_n": 1,
       "disconnect": 1, "cancel": 1}
COMPLETE_KINDS = ("stream", "plain", "stream_logprobs", "plain_logprobs", "stream_n", "plain_n")


@dataclass(slots=True)
class Outcome:
    kind: str
    sent_s: float
    status: int = 0  # HTTP status; 0: none (the client aborted on purpose, or the request was lost)
    lost: bool = False  # no status and not aborted on purpose (a timeout or a dropped connection)
    ttft_s: float = -1.0
    tpot_s: float = -1.0
    complete: bool = False  # a 200 with every token (and every logprob entry, when asked)
    cached_tokens: int = -1
    fresh_salt: bool = False  # the conversation's first request under its salt (nothing may be cached)


@dataclass(slots=True)
class Conversation:
    """A client's growing context under its cache salt. Past CONTEXT_LIMIT_TOKENS it starts over
    from the first half of its context under a salt never used before: that prefix is stored under
    the old salt only, so the first answer under the new one must find nothing cached."""

    name: str
    salt: str
    ids: list[int] = field(default_factory=list)  # prompt + answers so far
    busy: bool = False  # a turn in flight (the next turn waits for its answer)
    generation: int = 0

    def next_turn(self, rng: random.Random, limit_tokens: int) -> bool:
        """Start over if longer than `limit_tokens`; whether this turn is the first under a new salt."""
        if len(self.ids) <= limit_tokens:
            return False
        self.generation += 1
        self.salt = f"{rng.choice(SALTS)}/{self.name}/{self.generation}"
        self.ids = self.ids[: limit_tokens // 2]
        return True


def _body(kind: str, prompt: list[int], salt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "min_tokens": MAX_TOKENS, "ignore_eos": True,
            "temperature": 0, "cache_salt": salt, "return_token_ids": True}
    if kind.startswith("stream") or kind == "disconnect":
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    if kind.endswith("logprobs"):
        body["logprobs"] = TOP_LOGPROBS
    if kind.endswith("_n"):
        body["n"] = CHOICES
    return body


def _complete(kind: str, ids_by_choice: dict[int, list[int]], entries: int) -> bool:
    """Every choice has all its tokens, and every token its logprobs when asked for."""
    n = CHOICES if kind.endswith("_n") else 1
    return (sorted(ids_by_choice) == list(range(n)) and all(len(v) == MAX_TOKENS for v in ids_by_choice.values())
            and (not kind.endswith("logprobs") or entries == MAX_TOKENS))


async def _streamed(client: Any, url: str, body: dict, o: Outcome, t0: float, kind: str) -> list[int]:
    ids: dict[int, list[int]] = {}
    entries, first_s, last_s = 0, -1.0, -1.0
    async with client.stream("POST", url, json=body, timeout=REQUEST_TIMEOUT_S) as r:
        o.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            return []
        chunks = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices", []):
                if choice.get("token_ids"):
                    now = time.perf_counter() - t0
                    first_s = now if first_s < 0 else first_s
                    last_s = now if choice["index"] == 0 else last_s
                    ids.setdefault(choice["index"], []).extend(choice["token_ids"])
                entries += len((choice.get("logprobs") or {}).get("tokens", []))
            if chunk.get("usage"):
                o.cached_tokens = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
            chunks += 1
            if kind == "disconnect" and chunks >= DISCONNECT_AFTER_CHUNKS:
                o.status = 0  # gone on purpose: the server must cancel it on every engine
                return []
    first = ids.get(0, [])
    o.ttft_s = first_s - o.sent_s if first_s >= 0 else -1.0
    o.tpot_s = (last_s - first_s) / (len(first) - 1) if len(first) > 1 else -1.0  # choice 0's
    o.complete = _complete(kind, ids, entries)
    return first


async def _plain(client: Any, url: str, body: dict, o: Outcome, t0: float, kind: str) -> list[int]:
    if kind == "cancel":
        try:
            await asyncio.wait_for(client.post(url, json=body, timeout=REQUEST_TIMEOUT_S), CANCEL_AFTER_S)
        except asyncio.TimeoutError:
            return []  # gone on purpose (status 0)
        return []
    r = await client.post(url, json=body, timeout=REQUEST_TIMEOUT_S)
    o.status = r.status_code
    if r.status_code != 200:
        return []
    data = r.json()
    ids = {c["index"]: c.get("token_ids") or [] for c in data["choices"]}
    o.ttft_s = time.perf_counter() - t0 - o.sent_s  # the whole answer: no first token seen apart
    o.cached_tokens = data["usage"]["prompt_tokens_details"]["cached_tokens"]
    entries = len((data["choices"][0].get("logprobs") or {}).get("tokens", []))
    o.complete = _complete(kind, ids, entries)
    return ids.get(0, [])


async def one_request(client: Any, base: str, kind: str, conv: Conversation, rng: random.Random, t0: float,
                      vocab: int, limit_tokens: int = CONTEXT_LIMIT_TOKENS) -> Outcome:
    """A turn of `conv`: its context plus a new append; a complete answer extends the context."""
    fresh_salt = conv.next_turn(rng, limit_tokens)
    append = [rng.randrange(3, vocab) for _ in range(rng.randint(*APPEND_TOKENS))]
    prompt = conv.ids + append
    o = Outcome(kind, time.perf_counter() - t0, fresh_salt=fresh_salt)
    conv.busy = True
    try:
        body = _body(kind, prompt, conv.salt)
        ids = await (_streamed if body.get("stream") else _plain)(client, f"{base}/v1/completions", body, o, t0, kind)
        if o.complete:
            conv.ids = prompt + ids
    except Exception:  # noqa: BLE001 - a timeout or a dropped connection: the request is lost
        o.lost = True
    finally:
        conv.busy = False
    return o


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


class Clients:
    """The soak's clients: conversations, the mix, and every outcome."""

    def __init__(self, client: Any, base: str, vocab: int, seed: int, kinds: tuple[str, ...] = tuple(MIX),
                 context_limit_tokens: int = CONTEXT_LIMIT_TOKENS) -> None:
        self.client, self.base, self.vocab, self.limit_tokens = client, base, vocab, context_limit_tokens
        self.rng = random.Random(seed)
        self.convs = [Conversation(f"c{i}", f"{SALTS[i % len(SALTS)]}/c{i}/0") for i in range(CONVERSATIONS)]
        self.kinds, self.weights = kinds, [MIX[k] for k in kinds]
        self.outcomes: list[Outcome] = []
        self.t0 = time.perf_counter()
        self._spare = 0

    def _conversation(self) -> Conversation:
        free = [c for c in self.convs if not c.busy]
        if free:
            return self.rng.choice(free)
        self._spare += 1  # every conversation has a turn in flight: a one-off client
        return Conversation(f"spare{self._spare}", f"{self.rng.choice(SALTS)}/spare{self._spare}/0")

    async def send(self) -> Outcome:
        kind = self.rng.choices(self.kinds, self.weights)[0]
        o = await one_request(self.client, self.base, kind, self._conversation(), self.rng, self.t0, self.vocab,
                              self.limit_tokens)
        self.outcomes.append(o)
        return o

    async def closed_loop(self, clients: int, duration_s: float) -> float:
        """`clients` workers, each sending its next request when its last one ends; finished per second."""
        start, before = time.perf_counter(), len(self.outcomes)

        async def worker() -> None:
            while time.perf_counter() - start < duration_s:
                await self.send()

        await asyncio.gather(*(worker() for _ in range(clients)))
        done = [o for o in self.outcomes[before:] if o.complete]
        return len(done) / (time.perf_counter() - start)

    async def open_loop(self, rate_per_s: float, duration_s: float, sample: Any, sample_s: float) -> None:
        """Poisson arrivals at `rate_per_s` for `duration_s`; `sample()` every `sample_s`, then
        once all requests have ended."""
        start, tasks, nxt, next_sample = time.perf_counter(), [], 0.0, sample_s
        sample()
        while nxt < duration_s:
            now = time.perf_counter() - start
            if now >= next_sample:
                sample()
                next_sample += sample_s
            await asyncio.sleep(max(0.0, min(nxt, next_sample) - now))
            if time.perf_counter() - start >= nxt:
                tasks.append(asyncio.create_task(self.send()))
                nxt += self.rng.expovariate(rate_per_s)
        await asyncio.gather(*tasks)
        sample()


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
    import subprocess
    import sys
    import tempfile

    import httpx

    from ..runtime.model import load_model

    vocab = load_model(model, device="cpu").model.config.vocab_size
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(log_path or tempfile.mktemp(prefix="dualpath-soak-", suffix=".log"), "wb")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, "-m", "dualpath.cli", "serve", "--model", model, "--port", str(port)],
                            stdout=log, stderr=subprocess.STDOUT)
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
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
    return {"model": model, "minutes": minutes, "sample_s": sample_s, "cpus": len(os.sched_getaffinity(0)),
            "capacity_clients": clients, "capacity_per_s": capacity, "load_fraction": LOAD_FRACTION,
            "rate_per_s": rate, "mix": MIX, "max_tokens": MAX_TOKENS, "top_logprobs": TOP_LOGPROBS,
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
