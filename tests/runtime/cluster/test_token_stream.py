"""The client's stream is in index order whichever engine's report arrives first: the PE reports
token 0 and the DE the rest on different sockets, so the DE's token 1 can overtake the PE's token 0
(a fresh clone's CI run saw it after a migration). A migrated attempt continues at the client's
next index; a token after the end is dropped."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("zmq")

from dualpath.core.request import RequestId  # noqa: E402
from dualpath.core.snapshot import QueuedRequest  # noqa: E402
from dualpath.runtime.api import GenerationRequest, SamplingParams  # noqa: E402
from dualpath.runtime.router.state import RouterRequest, Stream  # noqa: E402
from dualpath.runtime.router.tokens import emit  # noqa: E402


class Metrics:
    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.finished_rids: list[int] = []

    def token(self, rid: int, index: int, now_s: float) -> None:
        self.tokens.append(index)

    def finished(self, rid: int) -> None:
        self.finished_rids.append(rid)


def _request(base_tokens: int = 0) -> RouterRequest:
    gen = GenerationRequest("r", (1, 2, 3), SamplingParams(max_tokens=8))
    rr = RouterRequest(1, gen, asyncio.Queue(), 0.0, 64, QueuedRequest(RequestId(1, 0), 3, 64, 64))
    rr.base_tokens = base_tokens
    return rr


def _drain(rr: RouterRequest) -> list[tuple[int, int, bool]]:
    out = []
    while not rr.queue.empty():
        ev = rr.queue.get_nowait()
        out.append((ev.index, ev.token_id, ev.finished))
    return out


@pytest.mark.parametrize("base", [0, 5])
def test_a_token_ahead_of_the_next_index_waits_for_the_ones_before_it(base):
    rr, m = _request(base), Metrics()
    emit(rr, m, 0.0, 11, 1, False, None)  # the DE's token 1 before the PE's token 0
    emit(rr, m, 0.0, 12, 2, False, None)
    assert _drain(rr) == [] and m.tokens == []
    emit(rr, m, 0.0, 10, 0, False, None)
    assert _drain(rr) == [(base, 10, False), (base + 1, 11, False), (base + 2, 12, False)]
    assert m.tokens == [base, base + 1, base + 2]
    assert rr.emitted == [10, 11, 12] and not rr.early


def test_an_early_last_token_ends_the_stream_once_the_gap_fills_and_later_reports_are_dropped():
    rr, m = _request(), Metrics()
    emit(rr, m, 0.0, 21, 1, True, "length")
    assert not rr.finished
    emit(rr, m, 0.0, 20, 0, False, None)
    assert _drain(rr) == [(0, 20, False), (1, 21, True)]
    assert rr.stream is Stream.FINISHED and m.finished_rids == [rr.stream_rid]
    emit(rr, m, 0.0, 22, 2, False, None)  # nothing after the end
    emit(rr, m, 0.0, 20, 0, False, None)  # nor a repeat
    assert _drain(rr) == [] and rr.emitted == [20, 21]
