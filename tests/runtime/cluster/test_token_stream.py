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
    """... each with its own logprobs (a waiting token keeps its own)."""
    rr, m = _request(base), Metrics()
    emit(rr, m, 0.0, 11, 1, False, None, [-1.0, [[11, -1.0]]])  # the DE's token 1 before the PE's token 0
    emit(rr, m, 0.0, 12, 2, False, None, [-2.0, [[12, -2.0]]])
    assert _drain(rr) == [] and m.tokens == []
    emit(rr, m, 0.0, 10, 0, False, None, [-0.5, [[10, -0.5]]])
    events = []
    while not rr.queue.empty():
        events.append(rr.queue.get_nowait())
    assert [(e.index, e.token_id, e.finished) for e in events] == [(base, 10, False), (base + 1, 11, False),
                                                                  (base + 2, 12, False)]
    assert [(e.logprobs.logprob, e.logprobs.top) for e in events] == [(-0.5, ((10, -0.5),)), (-1.0, ((11, -1.0),)),
                                                                     (-2.0, ((12, -2.0),))]
    assert m.tokens == [base, base + 1, base + 2]
    assert rr.emitted == [10, 11, 12] and not rr.early


def test_an_early_last_token_ends_the_stream_once_the_gap_fills_and_later_reports_are_dropped():
    rr, m = _request(), Metrics()
    emit(rr, m, 0.0, 21, 1, True, "length", [])
    assert not rr.finished
    emit(rr, m, 0.0, 20, 0, False, None, [])
    assert _drain(rr) == [(0, 20, False), (1, 21, True)]
    assert rr.stream is Stream.FINISHED and m.finished_rids == [rr.stream_rid]
    emit(rr, m, 0.0, 22, 2, False, None, [])  # nothing after the end
    emit(rr, m, 0.0, 20, 0, False, None, [])  # nor a repeat
    assert _drain(rr) == [] and rr.emitted == [20, 21]


def _router_with_a_placed_request(tmp_path, max_tokens: int):
    """A Router with no engine processes (one fake PE, one fake DE) and a request it placed on them."""
    from dualpath.config import RuntimeConfig
    from dualpath.core.phase import Phase
    from dualpath.runtime.router.router import Router
    from dualpath.runtime.router.state import EngineState

    class Clock:
        def now_s(self) -> float:
            return 0.0

    router = Router(RuntimeConfig(), model_name="t", tokenizer=None, max_context_tokens=4096, eos_token_ids=(),
                    kv_bytes_per_token=1, full_block_bytes=64, store=None, endpoint=f"ipc://{tmp_path}/router",
                    clock=Clock())
    pe, de = (EngineState(e, role, f"fake://{e}") for e, role in ((0, "prefill"), (1, "decode")))
    rr = router.new_record(GenerationRequest("r", (1, 2, 3), SamplingParams(max_tokens=max_tokens)), asyncio.Queue())
    router.metrics.arrived(rr.rid)
    rr.pe, rr.de = pe, de
    rr.advance(Phase.PREFILL_READY)
    return router, rr


@pytest.mark.parametrize("max_tokens", [1, 3])
def test_the_des_copy_of_the_first_token_stands_in_for_a_pe_report_that_never_came(tmp_path, max_tokens):
    """The PE killed with its FirstToken still queued, after its PromptReady went out: the DE's
    PromptLoaded carries the first token, so the stream neither hangs nor skips index 0."""
    from dualpath.runtime.protocol import FirstToken, PromptLoaded, Token

    router, rr = _router_with_a_placed_request(tmp_path, max_tokens)
    try:
        if max_tokens > 1:
            router._token(rr, Token(rr.rid, 31, 1, False, ""))  # the DE decodes on, the PE's report lost
        router._prompt_loaded(rr, PromptLoaded(rr.rid, 30, 0, [-0.25, [[30, -0.25]]]))  # with the PE's logprobs
        if max_tokens > 1:
            router._token(rr, Token(rr.rid, 32, 2, True, "length"))
        want = [(0, 30, max_tokens == 1)] + ([(1, 31, False), (2, 32, True)] if max_tokens > 1 else [])
        first = rr.queue._queue[0]  # noqa: SLF001 (the event _drain is about to take)
        assert first.logprobs is not None and first.logprobs.logprob == -0.25 and first.logprobs.top == ((30, -0.25),)
        assert _drain(rr) == want and rr.finished
        router._first_token(rr, FirstToken(rr.rid, 30, 0))  # a late PE report changes nothing
        assert _drain(rr) == [] and rr.emitted == [t for _, t, _ in want]
    finally:
        router.inbox.close()
