"""The soak's clients (bench/soak.py): the mix of requests they send, the conversations they
grow under cache salts, one request and its outcome, and closed- and open-loop senders."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

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


