"""`dualpath serve`'s app on a real local cluster, in a uvicorn thread on a free loopback port."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

import uvicorn

from dualpath.config import RuntimeConfig
from dualpath.runtime.apps.serve import make_app


@contextlib.contextmanager
def serve_in_thread(cfg: RuntimeConfig, start_timeout_s: float = 300) -> Iterator[tuple[str, object]]:
    """(the server's /v1 URL, its LocalCluster) while the server runs."""
    app, cluster = make_app(cfg)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                        timeout_graceful_shutdown=2))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not srv.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server did not start"
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1", cluster
    finally:
        srv.should_exit = True
        thread.join(timeout=60)
