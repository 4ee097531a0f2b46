"""Admission control: what the server accepts before any request reaches the backend.

Path of a request through it (server path step 3 of app.py):
  1. `check_room()` before the prompt is encoded: a full request table answers 429 at once,
     without spending CPU on chat rendering and BPE;
  2. `admit(prompt_tokens)` after encoding: a 429 if one more request or its prompt tokens would
     pass a limit, else a `Ticket` (all on the event loop, so check and count are one step);
  3. `Ticket.first_token()`: the request's prompt has been prefilled, its tokens leave the
     queued-prompt-token count (the prefill backlog the token limit bounds);
  4. `Ticket.finished()`: the last token; the request's service time joins the measurements
     that `Retry-After` is derived from;
  5. `Ticket.release()` at the terminal state, whatever it is (finished, backend error, client
     gone): the request leaves the in-flight count. Idempotent, so every exit path may call it.

A 429's `Retry-After` (whole seconds, RFC 9110 10.2.3) is the mean measured time for the limit
that was hit to make room: for the request limit, the mean service time (admission to last
token) of the last `SAMPLE_WINDOW` finished requests, i.e. about when today's in-flight requests
have been replaced; for the token limit, their mean time to first token (when today's queued
prompts have been prefilled). Clamped to [1, RETRY_AFTER_MAX_S]; 1 s before anything was measured.

Conservation (`check_invariants`): the in-flight count is the number of live tickets, the queued
counts are those of live tickets not yet past their first token.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass
from typing import Callable

from dualpath.errors import InputError
from dualpath.metrics.prometheus import Family, Sample, family

SAMPLE_WINDOW = 64  # finished requests averaged for Retry-After: recent enough to follow load changes
RETRY_AFTER_MIN_S = 1  # the smallest whole number of seconds the header can say and mean "later"
RETRY_AFTER_MAX_S = 60  # a hung request must not tell every client to go away for minutes


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """What one server accepts at once. Defaults are sized for the default cluster (1P1D,
    SmolLM2-135M); `dualpath serve` exposes each as an option."""

    # 4 x RuntimeConfig.engines.max_decode_batch (64): one full decode batch running and three waiting; a
    # request past that would wait more than three whole generations, so it is better told to retry
    max_inflight_requests: int = 256
    # Prefill backlog: prompt tokens admitted and not yet past their first token. 4 prompts of the
    # largest size (max_prompt_tokens), so one such prompt never blocks a queue on its own
    max_queued_prompt_tokens: int = 262_144
    # docs/paper.md §4.2 (Table 2): the longest agent context the paper serves is MaxLen 64K tokens
    max_prompt_tokens: int = 65_536
    # A 65,536-token prompt is at most ~0.5 MB as JSON token ids (<= 7 bytes each) and ~1.6 MB as
    # text (~4 chars per BPE token, up to 6 bytes per char escaped as \\uXXXX): 8 MiB leaves 4x room
    max_body_bytes: int = 8 * 2**20

    def __post_init__(self) -> None:
        for name in ("max_inflight_requests", "max_queued_prompt_tokens", "max_prompt_tokens", "max_body_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise InputError(f"{name} must be a positive integer, got {value!r}")
        if self.max_prompt_tokens > self.max_queued_prompt_tokens:
            raise InputError(f"max_prompt_tokens ({self.max_prompt_tokens}) must not exceed max_queued_prompt_tokens "
                             f"({self.max_queued_prompt_tokens}): such a prompt could never be admitted")


class Overloaded(Exception):
    """A request beyond a limit: answered with HTTP 429 and `Retry-After: retry_after_s`."""

    def __init__(self, message: str, limit: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message, self.limit, self.retry_after_s = message, limit, retry_after_s


class _MeanWindow:
    def __init__(self, size: int) -> None:
        self._values: deque[float] = deque(maxlen=size)

    def add(self, value_s: float) -> None:
        self._values.append(value_s)

    def mean_s(self) -> float | None:
        return sum(self._values) / len(self._values) if self._values else None


class Ticket:
    """One admitted request, from admission until `release()` (see the module docstring)."""

    __slots__ = ("_admission", "prompt_tokens", "admitted_s", "_queued", "_live")

    def __init__(self, admission: "Admission", prompt_tokens: int, admitted_s: float) -> None:
        self._admission, self.prompt_tokens, self.admitted_s = admission, prompt_tokens, admitted_s
        self._queued = self._live = True

    @property
    def live(self) -> bool:
        return self._live

    def first_token(self) -> None:
        if self._queued:
            self._queued = False
            self._admission._prefilled(self)

    def finished(self) -> None:
        if self._live:
            self._admission._service_s.add(self._admission._now_s() - self.admitted_s)

    def release(self) -> None:
        if self._live:
            if self._queued:  # ended before its first token: its prompt leaves the backlog unfilled
                self._queued = False
                self._admission._unqueue(self)
            self._live = False
            self._admission._release(self)

    @property
    def queued(self) -> bool:
        return self._queued


class Admission:
    """The server's request and prompt-token ledger; one per app, used on its event loop only."""

    def __init__(self, limits: ServerLimits, monotonic_s: Callable[[], float]) -> None:
        self.limits = limits
        self._now_s = monotonic_s
        self.num_inflight = 0  # live tickets
        self.num_queued = 0  # live tickets before their first token
        self.queued_prompt_tokens = 0  # their prompt tokens
        self.num_admitted = 0
        self.rejected: Counter[str] = Counter()  # limit ("requests" | "tokens") -> 429s sent
        self._live: set[Ticket] = set()
        self._service_s = _MeanWindow(SAMPLE_WINDOW)
        self._first_token_s = _MeanWindow(SAMPLE_WINDOW)

    # ---- decisions -----------------------------------------------------------------------------

    def check_room(self) -> None:
        """429 now if the request table is full (before the prompt is encoded)."""
        if self.num_inflight >= self.limits.max_inflight_requests:
            self._reject("requests", f"the server is at its limit of {self.limits.max_inflight_requests} "
                                     "requests in flight; retry later")

    def admit(self, prompt_tokens: int) -> Ticket:
        """A ticket for a request of `prompt_tokens`, or Overloaded. A lone prompt is always admitted
        into an empty backlog (ServerLimits keeps every allowed prompt within the token limit)."""
        self.check_room()
        limit = self.limits.max_queued_prompt_tokens
        if self.queued_prompt_tokens + prompt_tokens > limit:
            self._reject("tokens", f"the server's prefill backlog is full ({self.queued_prompt_tokens} of {limit} "
                                   f"prompt tokens queued; this prompt has {prompt_tokens}); retry later")
        ticket = Ticket(self, prompt_tokens, self._now_s())
        self._live.add(ticket)
        self.num_inflight += 1
        self.num_queued += 1
        self.queued_prompt_tokens += prompt_tokens
        self.num_admitted += 1
        return ticket

    def retry_after_s(self, limit: str) -> int:
        mean_s = (self._service_s if limit == "requests" else self._first_token_s).mean_s()
        if mean_s is None:
            return RETRY_AFTER_MIN_S
        return min(RETRY_AFTER_MAX_S, max(RETRY_AFTER_MIN_S, math.ceil(mean_s)))

    def _reject(self, limit: str, message: str) -> None:
        self.rejected[limit] += 1
        raise Overloaded(message, limit, self.retry_after_s(limit))

    # ---- ticket callbacks ----------------------------------------------------------------------

    def _unqueue(self, ticket: Ticket) -> None:
        self.num_queued -= 1
        self.queued_prompt_tokens -= ticket.prompt_tokens

    def _prefilled(self, ticket: Ticket) -> None:
        self._unqueue(ticket)
        self._first_token_s.add(self._now_s() - ticket.admitted_s)

    def _release(self, ticket: Ticket) -> None:
        self._live.discard(ticket)
        self.num_inflight -= 1

    # ---- checks and metrics --------------------------------------------------------------------

    def check_invariants(self) -> None:
        queued = [t for t in self._live if t.queued]
        if self.num_inflight != len(self._live) or any(not t.live for t in self._live):
            raise AssertionError(f"{self.num_inflight} in flight, {len(self._live)} live tickets")
        if self.num_queued != len(queued) or self.queued_prompt_tokens != sum(t.prompt_tokens for t in queued):
            raise AssertionError(f"{self.num_queued} queued ({self.queued_prompt_tokens} tokens) vs live tickets "
                                 f"{len(queued)} ({sum(t.prompt_tokens for t in queued)} tokens)")
        if not 0 <= self.num_inflight <= self.limits.max_inflight_requests:
            raise AssertionError(f"{self.num_inflight} in flight, limit {self.limits.max_inflight_requests}")

    def metric_families(self) -> list[Family]:
        return [
            family("dualpath_server_inflight_requests", "gauge", "Requests admitted and not yet in a terminal state.",
                   [Sample(self.num_inflight)]),
            family("dualpath_server_queued_requests", "gauge", "Admitted requests waiting for their first token.",
                   [Sample(self.num_queued)]),
            family("dualpath_server_queued_prompt_tokens", "gauge", "Prompt tokens of admitted requests before "
                   "their first token (the prefill backlog).", [Sample(self.queued_prompt_tokens)]),
            family("dualpath_server_admitted_requests_total", "counter", "Requests admitted.",
                   [Sample(self.num_admitted)]),
            family("dualpath_server_rejected_requests_total", "counter", "Requests answered 429, by the limit hit.",
                   [Sample(self.rejected[k], {"limit": k}) for k in ("requests", "tokens")]),
        ]
