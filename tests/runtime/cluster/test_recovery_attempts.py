"""A migrated attempt (runtime/router/recovery.py step 3) without processes: its prompt is the
client's plus the tokens streamed so far, its budget what is left, its seed the stream's; the
retry bound and policy `fail` end the stream with one error naming why."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("zmq")

from dualpath.config import FaultConfig, RuntimeConfig  # noqa: E402
from dualpath.core.request import RequestId  # noqa: E402
from dualpath.core.snapshot import QueuedRequest, ReadSide  # noqa: E402
from dualpath.runtime.api import GenerationRequest, SamplingParams, ServiceUnavailable  # noqa: E402
from dualpath.runtime.protocol import EngineRole  # noqa: E402
from dualpath.runtime.router.recovery import Recovery  # noqa: E402
from dualpath.runtime.router.state import EngineState, RouterRequest  # noqa: E402


class _Metrics:
    def __init__(self) -> None:
        self.migrated_rids: list[int] = []
        self.failed_rids: list[int] = []

    def migrated(self, rid: int) -> None:
        self.migrated_rids.append(rid)

    def failed(self, rid: int) -> None:
        self.failed_rids.append(rid)


def _recovery(policy: str = "recompute", retries: int = 2) -> Recovery:
    """Recovery over a request table that only registers records (the steps under test need no more)."""
    ids = iter(range(100, 200))
    table = SimpleNamespace(metrics=_Metrics(), new_record=lambda req, queue: RouterRequest(
        next(ids), req, queue, 0.0, 128, QueuedRequest(RequestId(0, 0), len(req.prompt_ids), 0, 128)))
    cfg = RuntimeConfig(model="tiny", faults=FaultConfig(policy=policy, retries=retries))
    return Recovery(table, None, None, None, cfg)


def _streaming(emitted: list[int]) -> RouterRequest:
    req = GenerationRequest("c", (1, 2, 3), SamplingParams(max_tokens=10, min_tokens=4, temperature=0.0))
    rr = RouterRequest(7, req, asyncio.Queue(), 0.0, 64, QueuedRequest(RequestId(7, 0), 3, 64, 64))
    rr.emitted = list(emitted)
    rr.pe = EngineState(0, EngineRole.PREFILL, "p")
    rr.de = EngineState(1, EngineRole.DECODE, "d")
    rr.side = ReadSide.DECODE
    return rr


def test_the_next_attempt_continues_the_stream_where_it_stopped():
    recovery = _recovery()
    rr = _streaming([40, 41, 42])
    nxt, why = recovery.next_attempt(rr, rr.de)
    assert why == "" and rr.current is nxt and nxt.rid == 100
    assert nxt.req.prompt_ids == (1, 2, 3, 40, 41, 42) and nxt.origin is rr.req
    p = nxt.req.params
    assert (p.max_tokens, p.min_tokens, p.seed, p.temperature) == (7, 1, 7, 0.0)  # seed: the stream's id
    assert (nxt.base_tokens, nxt.emitted, nxt.attempt, nxt.stream_rid) == (3, [40, 41, 42], 1, 7)
    assert nxt.pe_side_only  # its DE-path read's DE died: the retry reads on the PE side
    again, _ = recovery.next_attempt(nxt, nxt.pe)
    assert again.req.prompt_ids == (1, 2, 3, 40, 41, 42) and again.attempt == 2 and again.stream_rid == 7
    assert recovery._table.metrics.migrated_rids == [7, 7]


def test_the_retry_bound_and_policy_fail_end_the_stream_with_one_error():
    rr = _streaming([40])
    rr.attempt = 2
    nxt, why = _recovery(retries=2).next_attempt(rr, rr.de)
    assert nxt is None and why == "its 2 retries (faults.retries) are spent"
    nxt, why = _recovery(policy="fail").next_attempt(_streaming([]), rr.de)
    assert nxt is None and why == "faults.policy is fail"
    recovery = _recovery()
    recovery.fail(rr, "decode engine 1 killed by SIGKILL; " + why)
    recovery.fail(rr, "a second report")  # a stream ends once
    assert rr.queue.qsize() == 1 and recovery._table.metrics.failed_rids == [7]
    err = rr.queue.get_nowait()
    assert isinstance(err, ServiceUnavailable)
    assert str(err) == "the request failed: decode engine 1 killed by SIGKILL; faults.policy is fail"
