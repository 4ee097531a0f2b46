"""The router's request record carries the shared `Phase`: it walks the legal path forward, skips
READING without a hit and DECODING for a one-token answer, treats a report of a step already
passed as a no-op (two engines' messages may cross), and stops where a cancelled request was."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("zmq")

from dualpath.core.phase import Phase  # noqa: E402
from dualpath.core.request import RequestId  # noqa: E402
from dualpath.core.snapshot import QueuedRequest  # noqa: E402
from dualpath.runtime.api import GenerationRequest, SamplingParams  # noqa: E402
from dualpath.core.phase import IllegalTransition  # noqa: E402
from dualpath.runtime.router.state import RouterRequest, Stream  # noqa: E402


def _request(max_tokens: int, hit_tokens: int) -> RouterRequest:
    gen = GenerationRequest("r", (1, 2, 3), SamplingParams(max_tokens=max_tokens))
    rr = RouterRequest(1, gen, asyncio.Queue(), 0.0, 64, QueuedRequest(RequestId(1, 0), 3, 64, 64))
    rr.hit_tokens = hit_tokens
    return rr


def _walk(rr: RouterRequest, *targets: Phase) -> list[Phase]:
    seen = []
    for t in targets:
        rr.advance(t)
        seen.append(rr.phase)
    return seen


def test_a_request_with_a_hit_reads_then_decodes():
    rr = _request(max_tokens=4, hit_tokens=64)
    assert not rr.placed
    got = _walk(rr, Phase.PE_ASSIGNED, Phase.READING, Phase.PREFILL_READY, Phase.KV_TO_DECODE, Phase.DECODING,
                Phase.FINISHED)
    assert got == [Phase.PE_ASSIGNED, Phase.READING, Phase.PREFILL_READY, Phase.KV_TO_DECODE, Phase.DECODING,
                   Phase.FINISHED]
    assert rr.placed and rr.prompt_loaded


def test_without_a_hit_reading_is_skipped_and_a_late_report_is_a_no_op():
    rr = _request(max_tokens=4, hit_tokens=0)
    rr.advance(Phase.PE_ASSIGNED)
    rr.advance(Phase.PREFILL_READY)
    assert rr.phase is Phase.PREFILL_READY
    rr.advance(Phase.DECODING)  # PromptLoaded before the first token's message: walks through
    assert rr.phase is Phase.DECODING and rr.prompt_loaded
    rr.advance(Phase.KV_TO_DECODE)  # the first token's report, late
    assert rr.phase is Phase.DECODING


def test_a_one_token_answer_finishes_without_decoding():
    rr = _request(max_tokens=1, hit_tokens=0)
    rr.advance(Phase.KV_TO_DECODE)
    assert not rr.prompt_loaded  # the answer is held until the DE has the prompt
    rr.advance(Phase.DECODING)
    assert rr.phase is Phase.FINISHED and rr.prompt_loaded


def test_a_cancelled_request_stops_where_it_was():
    rr = _request(max_tokens=4, hit_tokens=64)
    rr.advance(Phase.READING)
    rr.end(Stream.CANCELLED)
    rr.advance(Phase.FINISHED)
    assert rr.phase is Phase.READING and rr.placed


def test_a_stream_ends_once_and_a_cut_off_attempt_may_still_fail():
    rr = _request(max_tokens=4, hit_tokens=0)
    assert (rr.finished, rr.cancelled, rr.failed) == (False, False, False)
    rr.end(Stream.CANCELLED)  # another attempt carries the stream on, or the client went away
    rr.end(Stream.CANCELLED)  # said twice: no change
    assert (rr.finished, rr.cancelled, rr.failed) == (True, True, False)
    rr.end(Stream.FAILED)
    assert (rr.finished, rr.cancelled, rr.failed) == (True, True, True)
    done = _request(max_tokens=4, hit_tokens=0)
    done.end(Stream.FINISHED)
    assert done.finished and not done.cancelled
    for later in (Stream.CANCELLED, Stream.FAILED, Stream.OPEN):
        with pytest.raises(IllegalTransition, match=f"FINISHED -> {later.name}"):
            done.end(later)
