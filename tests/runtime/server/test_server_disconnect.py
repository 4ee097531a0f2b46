"""A client that goes away cancels its request: the router's generator is closed, freeing it."""

from __future__ import annotations

import time

import anyio
import httpx
import pytest

from dualpath.runtime.server.fake_backend import FakeBackend
from dualpath.runtime.server.app import EventStream

LONG = {"messages": [{"role": "user", "content": "go"}], "max_tokens": 2000, "min_tokens": 2000}


def test_disconnect_mid_stream_cancels_the_request(start_server, wait_until):
    server = start_server(FakeBackend(token_delay_s=0.02))
    router = server.router
    with httpx.Client(base_url=server.url, timeout=5) as client:
        with client.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as response:
            lines = response.iter_lines()
            received = [line for line, _ in zip(lines, range(8)) if line.startswith("data: ")]
            assert len(received) >= 3
            assert len(router.active_request_ids) == 1
        # leaving the block closes the connection with the body unread
    assert wait_until(lambda: not router.active_request_ids)
    assert router.cancelled_request_ids == [router.received[0].request_id] and router.num_finished == 0
    assert router.num_generated_tokens < 200
    # the server is still fine
    reply = httpx.post(server.url + "/v1/chat/completions", json={**LONG, "max_tokens": 2, "min_tokens": 0})
    assert reply.status_code == 200


@pytest.mark.parametrize("stream", [True, False])
def test_disconnect_before_first_token_cancels_the_request(start_server, wait_until, stream):
    server = start_server(FakeBackend(first_token_delay_s=30))
    router = server.router
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/v1/chat/completions", json={**LONG, "stream": stream}, timeout=0.5)
    assert router.received, "the request reached the router"
    assert wait_until(lambda: not router.active_request_ids)
    assert router.cancelled_request_ids == [router.received[0].request_id]
    assert router.num_generated_tokens == 0


def test_disconnect_while_blocked_on_a_full_socket(start_server, wait_until):
    """No token delay: the server outruns the client and waits in `send` (flow control), with its
    generators suspended at a `yield`; only an explicit close frees the request then."""
    # 500K tokens of SSE (~75 MB) cannot all fit in loopback socket buffers (several MB each way),
    # so the stream is still running when the client closes, however fast the server is
    server = start_server(FakeBackend(max_context_tokens=600_000))
    router = server.router
    body = {"prompt": "go", "max_tokens": 500_000, "min_tokens": 500_000, "stream": True}
    with httpx.Client(base_url=server.url, timeout=5) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()  # kept: dropping the iterator would close the connection
            assert next(lines).startswith("data: ")
            assert wait_until(lambda: router.num_generated_tokens > 1000)
            time.sleep(0.2)
            assert router.active_request_ids  # stalled by flow control, not finished
            num_generated_tokens = router.num_generated_tokens
    assert wait_until(lambda: not router.active_request_ids)
    assert router.cancelled_request_ids == [router.received[0].request_id]
    assert router.num_generated_tokens < 500_000 and router.num_generated_tokens < num_generated_tokens + 1000


def test_event_stream_closes_its_generator_when_send_fails():
    """ASGI servers of spec 2.4 report a gone client by raising OSError from `send`; the SSE
    generator (suspended at a yield, so no cancellation reaches it) must still be closed."""
    closed: list[bool] = []

    async def body():
        try:
            while True:
                yield "data: {}\n\n"
        finally:
            closed.append(True)

    async def receive() -> dict:
        await anyio.sleep_forever()

    num_sent = 0

    async def send(message: dict) -> None:
        nonlocal num_sent
        num_sent += 1
        if num_sent > 3:
            raise OSError("connection reset by peer")

    async def main() -> None:
        stream = body()  # referenced until the end: only an explicit close can run its finally
        await EventStream(stream, media_type="text/event-stream")({"type": "http"}, receive, send)
        assert closed == [True]

    anyio.run(main)
