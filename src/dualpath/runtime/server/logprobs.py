"""Logprobs in the OpenAI shapes: each generated token's `TokenLogprobs` (runtime/api.py; raw
log-probabilities, before temperature: runtime/engine/logprobs.py) spelled with the tokenizer, then
written as chat's `{"content": [...]}` or completions' `{"tokens", "token_logprobs",
"top_logprobs", "text_offset"}`.

A token is spelled by its own bytes (a byte-level BPE token may hold part of a UTF-8 character:
its `token` text then shows U+FFFD, its `bytes` the exact bytes, as OpenAI's do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dualpath.runtime.api import TokenLogprobs, TokenizerLike

# JSON has no -Infinity: a token the model rules out entirely is reported at this floor, as vLLM does
LOGPROB_FLOOR = -9999.0


@dataclass(frozen=True, slots=True)
class Spelled:
    """A token with its logprob, as the client reads it."""

    text: str
    data: bytes
    logprob: float

    def chat_json(self) -> dict[str, Any]:
        return {"token": self.text, "logprob": self.logprob, "bytes": list(self.data)}


@dataclass(frozen=True, slots=True)
class LogprobEntry:
    """One generated token and the most likely tokens at its position."""

    sampled: Spelled
    top: tuple[Spelled, ...]


def _spell(tokenizer: TokenizerLike, token_id: int, logprob: float) -> Spelled:
    data = tokenizer.token_bytes(token_id)
    return Spelled(data.decode("utf-8", errors="replace"), data, max(logprob, LOGPROB_FLOOR))


def spell(tokenizer: TokenizerLike, token_id: int, logprobs: TokenLogprobs) -> LogprobEntry:
    return LogprobEntry(_spell(tokenizer, token_id, logprobs.logprob),
                        tuple(_spell(tokenizer, t, lp) for t, lp in logprobs.top))


def chat_logprobs(entries: tuple[LogprobEntry, ...]) -> dict[str, Any]:
    """Chat's `choice.logprobs`: per token its text, logprob, bytes and `top_logprobs` (the
    `top_logprobs` most likely, most likely first)."""
    content = [{**e.sampled.chat_json(), "top_logprobs": [t.chat_json() for t in e.top]} for e in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: tuple[LogprobEntry, ...], offset: int) -> dict[str, Any]:
    """Completions' `choice.logprobs`: parallel lists; `top_logprobs` maps the `logprobs` most likely
    tokens' texts and the sampled one's to their logprobs (OpenAI: up to logprobs + 1 entries);
    `text_offset` counts the characters of the tokens' texts from `offset` (the text before them)."""
    offsets, at = [], offset
    for e in entries:
        offsets.append(at)
        at += len(e.sampled.text)
    return {"tokens": [e.sampled.text for e in entries],
            "token_logprobs": [e.sampled.logprob for e in entries],
            "top_logprobs": [{**{t.text: t.logprob for t in e.top}, e.sampled.text: e.sampled.logprob}
                             for e in entries],
            "text_offset": offsets}
