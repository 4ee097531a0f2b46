"""The seam between the HTTP server and the cluster: what a router offers a front end.

The server (`runtime/server/app.py`) knows nothing about engines, lanes or storage; it turns HTTP
requests into `GenerationRequest`s and streams back `TokenEvent`s. The real implementation is
`runtime/router/router.py`; tests use an in-process fake.

Contract of `ServingBackend.generate` (the router implements it; the HTTP app needs nothing else):
  1. it validates nothing the server can validate (lengths, types); it may still raise
     `InputError` for what only it can know;
  2. it yields one `TokenEvent` per generated token, each choice's in order (`choice`; a request
     asks for `SamplingParams.n` of them, sampled from one prefill); a choice's last one has
     `finished=True` and a `finish_reason` ("stop": an EOS / stop token was generated, "length":
     max_tokens); the stream ends after every choice's last one;
  3. if the consumer stops iterating (client gone), closing the async generator cancels the
     request and frees its resources on every engine;
  4. if it can neither serve nor finish the request (its engine died and none can continue it),
     it raises `ServiceUnavailable`, once, instead of the next event: never a hang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AsyncIterator, Protocol, Sequence

from ..metrics.prometheus import Family


class ServiceUnavailable(Exception):
    """The backend cannot serve or finish a request now: an engine it needs is dead and no other
    can take over (runtime/router/recovery.py). The server answers HTTP 503 before a response
    starts, and an SSE error event (then the end of the stream) after; the message names the cause."""

    code = "engine_unavailable"


MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs (chat), and vLLM's default max_logprobs
NO_LOGPROBS = -1  # SamplingParams.logprobs / the assignments' field for a request that asked for none
MAX_CHOICES = 16  # SamplingParams.n's bound: a project choice (vLLM has none; each choice holds its own KV)


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """One sampled token's raw log-probability and the `k` most likely tokens' (most likely first);
    how they are computed: runtime/engine/logprobs.py."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def to_wire(self) -> list:
        """msgpack-native form for the engines' messages (transport/messages.py)."""
        return [self.logprob, [[t, lp] for t, lp in self.top]]

    @staticmethod
    def from_wire(wire: list) -> TokenLogprobs | None:
        """The inverse of `to_wire`; an empty list (the request asked for none) is None."""
        if not wire:
            return None
        return TokenLogprobs(float(wire[0]), tuple((int(t), float(lp)) for t, lp in wire[1]))


@dataclass(frozen=True, slots=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    # Generate at least this many tokens (EOS is ignored until then); trace replay sets
    # min_tokens = max_tokens to force exactly N tokens, as the paper's replay does (A.3).
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    # The sampled tokens' logprobs and the `logprobs` most likely tokens' at each (0..MAX_TOP_LOGPROBS);
    # NO_LOGPROBS: none
    logprobs: int = NO_LOGPROBS
    # Choices sampled from the one prefill (OpenAI's `n`); their decodes share the prompt's KV blocks
    n: int = 1

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be in [0, max_tokens]")
        if self.logprobs != NO_LOGPROBS and not 0 <= self.logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"logprobs must be {NO_LOGPROBS} (none) or in [0, {MAX_TOP_LOGPROBS}]")
        if not 1 <= self.n <= MAX_CHOICES:
            raise ValueError(f"n must be in [1, {MAX_CHOICES}]")


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    request_id: str
    prompt_ids: tuple[int, ...]
    params: SamplingParams
    cache_salt: str = ""  # its blocks' keys are salted with it (core/blocks.py: salted_root); "": none


@dataclass(frozen=True, slots=True)
class TokenEvent:
    token_id: int
    index: int  # 0 for the first generated token
    finished: bool
    finish_reason: str | None  # "stop" | "length" | None while running
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV was loaded instead of computed
    cached_path: str = ""  # the read path that loaded them: "prefill" or "decode" ("": none loaded)
    logprobs: TokenLogprobs | None = None  # when the request asked for them (SamplingParams.logprobs)
    choice: int = 0  # which of the request's SamplingParams.n choices the token belongs to


class TokenizerLike(Protocol):
    def encode(self, text: str, allow_added_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special: bool = False) -> str: ...

    def token_bytes(self, token_id: int) -> bytes: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...


class ServingBackend(Protocol):
    model_name: str
    tokenizer: TokenizerLike
    max_context_tokens: int  # prompt + generated must fit
    eos_token_ids: tuple[int, ...]

    def generate(self, request: GenerationRequest) -> AsyncIterator[TokenEvent]: ...

    def health(self) -> dict: ...

    def metric_families(self) -> list[Family]:
        """The backend's metrics, for the server's Prometheus exposition."""
        ...
