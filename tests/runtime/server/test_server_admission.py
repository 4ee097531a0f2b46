"""Admission control: beyond a limit a 429 with Retry-After, at once and without reaching the
backend; admitted requests finish as if alone; the ledger always returns to zero."""

from __future__ import annotations

import asyncio
import json
import math

import httpx
import pytest

from dualpath.errors import InputError
from dualpath.runtime.server.admission import RETRY_AFTER_MAX_S, Admission, Overloaded, ServerLimits
from dualpath.runtime.server.fake_backend import DEFAULT_REPLY_TEXT, FakeBackend

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}]}
FAIL_ID = 33  # a prompt starting with this token id fails in the backend after FAIL_AFTER_TOKENS
FAIL_AFTER_TOKENS = 40  # at 10 ms a token: still running when its whole wave has been admitted


async def until(predicate, timeout_s: float = 10.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if predicate():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached in time")


def assert_429(response: httpx.Response, limit: str) -> None:
    assert response.status_code == 429
    error = response.json()["error"]
    assert (error["type"], error["code"]) == (limit, "rate_limit_exceeded") and error["message"]
    assert int(response.headers["Retry-After"]) >= 1


def assert_idle(admission: Admission) -> None:
    admission.check_invariants()
    assert (admission.num_inflight, admission.num_queued, admission.queued_prompt_tokens) == (0, 0, 0)


# ---- the ledger on its own -----------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_retry_after_is_the_measured_mean_time_rounded_up_and_clamped():
    clock = FakeClock()
    admission = Admission(ServerLimits(max_inflight_requests=1, max_queued_prompt_tokens=100, max_prompt_tokens=100),
                          clock)
    assert admission.retry_after_s("requests") == admission.retry_after_s("tokens") == 1  # nothing measured yet
    for prefill_s, decode_s in ((2.0, 4.0), (3.0, 6.2)):
        ticket = admission.admit(10)
        with pytest.raises(Overloaded) as full:
            admission.admit(10)
        assert full.value.limit == "requests"
        clock.now_s += prefill_s
        ticket.first_token()
        clock.now_s += decode_s
        ticket.finished()
        ticket.release()
        ticket.release()  # idempotent: a second terminal path changes nothing
        admission.check_invariants()
    assert admission.retry_after_s("tokens") == math.ceil((2.0 + 3.0) / 2)  # mean time to first token: 3
    assert admission.retry_after_s("requests") == math.ceil((6.0 + 9.2) / 2)  # mean service time 7.6 -> 8
    slow = admission.admit(10)
    clock.now_s += 10_000
    slow.first_token()
    slow.finished()
    slow.release()
    assert admission.retry_after_s("requests") == RETRY_AFTER_MAX_S
    assert admission.rejected["requests"] == 2 and admission.num_admitted == 3


def test_token_limit_counts_prompts_until_their_first_token():
    admission = Admission(ServerLimits(max_queued_prompt_tokens=100, max_prompt_tokens=100), FakeClock())
    a = admission.admit(60)
    with pytest.raises(Overloaded) as over:
        admission.admit(41)
    assert over.value.limit == "tokens" and admission.queued_prompt_tokens == 60
    b = admission.admit(40)
    assert admission.queued_prompt_tokens == 100
    a.first_token()  # prefilled: its tokens leave the backlog though the request is still in flight
    assert (admission.queued_prompt_tokens, admission.num_queued, admission.num_inflight) == (40, 1, 2)
    b.release()  # gone before its first token (client left): its tokens leave too
    a.release()
    assert_idle(admission)


@pytest.mark.parametrize("kwargs", [dict(max_inflight_requests=0), dict(max_body_bytes=-1),
                                    dict(max_prompt_tokens=10, max_queued_prompt_tokens=5),
                                    dict(max_queued_prompt_tokens=2.5)])
def test_limits_are_validated(kwargs):
    with pytest.raises(InputError):
        ServerLimits(**kwargs)


# ---- over HTTP -----------------------------------------------------------------------------------


def test_beyond_the_request_limit_429_at_once_and_the_admitted_finish(start_server):
    server = start_server(FakeBackend(token_delay_s=0.01), limits=ServerLimits(max_inflight_requests=2))
    router, admission = server.router, server.admission

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            admitted = [asyncio.create_task(client.post(CHAT, json=BODY)) for _ in range(2)]
            await until(lambda: admission.num_inflight == 2)
            over = [await client.post(CHAT, json={**BODY, "stream": stream}) for stream in (False, True)]
            assert admission.num_inflight == 2 and len(router.received) == 2  # the 429s never reached it
            for response in over:
                assert_429(response, "requests")
                assert response.headers["Retry-After"] == "1"  # nothing finished yet: the floor
            for response in await asyncio.gather(*admitted):
                assert response.status_code == 200
                assert response.json()["choices"][0]["message"]["content"] == DEFAULT_REPLY_TEXT
                assert response.json()["choices"][0]["finish_reason"] == "stop"
            again = await client.post(CHAT, json=BODY)
            assert again.status_code == 200
            metrics = (await client.get("/metrics")).text
        assert 'dualpath_server_rejected_requests_total{limit="requests"} 2.0' in metrics
        assert 'dualpath_http_responses_total{code="429",route="/v1/chat/completions"} 2.0' in metrics

    asyncio.run(main())
    assert_idle(admission)
    assert router.num_finished == 3 and admission.num_admitted == 3


def test_token_limit_429_until_the_queued_prompts_are_prefilled(start_server):
    server = start_server(FakeBackend(first_token_delay_s=0.5),
                          limits=ServerLimits(max_queued_prompt_tokens=100, max_prompt_tokens=100))
    router, admission = server.router, server.admission

    def prompt(num_tokens: int) -> dict:
        return {"prompt": [65] * num_tokens, "max_tokens": 4}

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            a = asyncio.create_task(client.post(COMPLETIONS, json=prompt(60)))
            await until(lambda: admission.queued_prompt_tokens == 60)
            b = await client.post(COMPLETIONS, json=prompt(50))
            assert_429(b, "tokens")
            c = asyncio.create_task(client.post(COMPLETIONS, json=prompt(40)))  # fits beside a
            await until(lambda: admission.queued_prompt_tokens == 100)
            assert len(router.received) == 2
            assert (await a).status_code == 200  # a's first token left the backlog
            b = await client.post(COMPLETIONS, json=prompt(50))
            assert b.status_code == 200 and (await c).status_code == 200
            assert [r.json()["usage"]["prompt_tokens"] for r in (await a, b, await c)] == [60, 50, 40]

    asyncio.run(main())
    assert_idle(admission)
    assert router.num_finished == 3 and admission.rejected["tokens"] == 1


def test_prompt_over_the_prompt_limit_is_a_400(start_server):
    server = start_server(limits=ServerLimits(max_prompt_tokens=50))
    reply = httpx.post(server.url + COMPLETIONS, json={"prompt": [65] * 51, "max_tokens": 2})
    assert reply.status_code == 400
    assert reply.json()["error"]["code"] == "prompt_too_long" and reply.json()["error"]["param"] == "prompt"
    assert not server.router.received
    assert httpx.post(server.url + COMPLETIONS, json={"prompt": [65] * 50, "max_tokens": 2}).status_code == 200


# ---- a burst: finished, failed and abandoned requests all leave the ledger ---------------------

KINDS = ("ok", "ok_stream", "fail", "fail_stream", "gone_stream", "gone")


async def one_request(client: httpx.AsyncClient, kind: str, index: int) -> tuple[str, int | None, str]:
    """(kind, status or None when the client left, what it received)"""
    first = FAIL_ID if kind.startswith("fail") else 65 + index % 20
    body = {"prompt": [first, 66, 67], "stream": kind.endswith("stream"), "max_tokens": 400}
    if kind.startswith("gone"):
        body["min_tokens"] = 400  # long enough to still be running when its client leaves
    if kind == "gone":
        try:
            await client.post(COMPLETIONS, json=body, timeout=0.4)
        except httpx.ReadTimeout:
            return kind, None, ""
        raise AssertionError("a 400-token reply at 10 ms a token came back within 0.4 s")
    if not body["stream"]:
        response = await client.post(COMPLETIONS, json=body)
        return kind, response.status_code, response.text
    async with client.stream("POST", COMPLETIONS, json=body) as response:
        if response.status_code != 200:
            return kind, response.status_code, (await response.aread()).decode()
        lines = []
        async for line in response.aiter_lines():
            lines.append(line)
            if kind == "gone_stream" and len(lines) >= 80:  # ~40 tokens (a data line and a blank one each)
                return kind, None, ""  # leaving the block drops the connection mid-stream
        return kind, 200, "\n".join(lines)


def sse_text(raw: str) -> str:
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    return "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))


def test_a_burst_with_errors_and_disconnects_leaves_the_ledger_at_zero(start_server):
    router = FakeBackend(token_delay_s=0.01, fail_after_tokens=lambda p: FAIL_AFTER_TOKENS if p[0] == FAIL_ID else None)
    server = start_server(router, limits=ServerLimits(max_inflight_requests=len(KINDS)))
    admission = server.admission
    outcomes: list[tuple[str, int | None, str]] = []
    rejected: list[httpx.Response] = []

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=10) as client:
            for wave in range(3):
                tasks = [asyncio.create_task(one_request(client, kind, wave * 10 + i)) for i, kind in enumerate(KINDS)]
                await until(lambda: admission.num_inflight == len(KINDS) or any(t.done() for t in tasks))
                assert admission.num_inflight == len(KINDS), "the whole wave is admitted together"
                rejected.extend(await asyncio.gather(*(client.post(COMPLETIONS, json={"prompt": [70], "max_tokens": 2})
                                                       for _ in range(4))))
                outcomes.extend(await asyncio.gather(*tasks))
                await until(lambda: admission.num_inflight == 0)

    asyncio.run(main())
    assert_idle(admission)
    assert not router.active_request_ids
    for response in rejected:
        assert_429(response, "requests")
    assert admission.rejected["requests"] == len(rejected) == 12
    assert admission.num_admitted == len(router.received) == 3 * len(KINDS)  # no 429 reached the backend
    by_kind: dict[str, list[tuple[int | None, str]]] = {}
    for kind, status, text in outcomes:
        by_kind.setdefault(kind, []).append((status, text))
    for status, text in by_kind["ok"]:
        assert status == 200 and json.loads(text)["choices"][0]["text"] == DEFAULT_REPLY_TEXT
    for status, text in by_kind["ok_stream"]:
        assert status == 200 and sse_text(text) == DEFAULT_REPLY_TEXT and text.rstrip().endswith("data: [DONE]")
    for status, text in by_kind["fail"]:
        assert status == 500 and json.loads(text)["error"]["type"] == "server_error"
    for status, text in by_kind["fail_stream"]:
        assert status == 200 and '"type":"server_error"' in text and text.rstrip().endswith("data: [DONE]")
    assert all(status is None for kind in ("gone", "gone_stream") for status, _ in by_kind[kind])
    assert router.num_finished == 6 and len(router.failed_request_ids) == 6 and len(router.cancelled_request_ids) == 6
