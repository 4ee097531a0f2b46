"""A real uvicorn server on a free localhost port, in a background thread, per test."""

from __future__ import annotations

import threading
import time
from typing import Callable, Iterator

import pytest
import uvicorn

from dualpath.runtime.server.fake_backend import FakeBackend
from dualpath.runtime.model.loader import tiny_tokenizer
from dualpath.runtime.server.app import create_app

WALL_TIME_S = 1_700_000_000.0


class RunningServer:
    def __init__(self, router: FakeBackend, api_key: str | None, lifespan=None, **app_kwargs) -> None:
        ids = iter(range(1_000_000))
        app = create_app(router, api_key, wall_time_s=lambda: WALL_TIME_S, new_request_id=lambda: f"{next(ids):06d}",
                         lifespan=lifespan, **app_kwargs)
        self.router = router
        self.admission = app.state.admission
        # port 0 through uvicorn's own bind (as `serve` does); the real port is read once bound
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    """SmolLM2's real byte-level BPE (49152 tokens), read from the GGUF metadata only (~3 s)."""
    gguf = pytest.importorskip("gguf")
    from dualpath.errors import InputError
    from dualpath.runtime.model.gguf_loader import read_metadata
    from dualpath.runtime.model.loader import smollm2_gguf_path
    from dualpath.runtime.model.tokenizer import tokenizer_from_gguf_metadata

    try:
        path = smollm2_gguf_path()
    except InputError as exc:
        pytest.skip(str(exc))
    return tokenizer_from_gguf_metadata(read_metadata(gguf.GGUFReader(path)))


@pytest.fixture
def served(start_server):
    """(a server over a FakeBackend, no API key; the official openai client on it)."""
    import openai

    server = start_server()
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    yield server, client
    client.close()


@pytest.fixture
def start_server() -> Iterator[Callable[..., RunningServer]]:
    """start_server(router=None, api_key=None, lifespan=None, **create_app_kwargs) -> RunningServer;
    stopped after the test."""
    running: list[RunningServer] = []

    def start(router: FakeBackend | None = None, api_key: str | None = None, lifespan=None, **app_kwargs) -> RunningServer:
        server = RunningServer(router if router is not None else FakeBackend(), api_key, lifespan, **app_kwargs)
        running.append(server)
        return server

    yield start
    for server in running:
        server.stop()


def _wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.fixture
def wait_until() -> Callable[..., bool]:
    """wait_until(predicate, timeout_s=10.0) -> whether it became true in time (polled every 10 ms)."""
    return _wait_until
