"""`dualpath store serve`: the storage service (runtime/store/service.py) in the foreground."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import InputError


def parse_listen(listen: str) -> tuple[str, int]:
    """HOST:PORT ([::1]:PORT for IPv6); port 0 picks a free port."""
    host, sep, port = listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise InputError(f"--listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:7400")
    return host, int(port)


def serve(
    directory: Annotated[Path, typer.Option("--dir", help="root of the served stores (one subdirectory per model)")],
    listen: Annotated[str, typer.Option(help="HOST:PORT to bind (port 0: any free port)")] = "127.0.0.1:7400",
    token_file: Annotated[Optional[Path], typer.Option(help="shared token clients must present (required beyond loopback)")] = None,
    capacity_bytes: Annotated[Optional[int], typer.Option(help="capacity of each served store (default: unbounded)")] = None,
    threads: Annotated[int, typer.Option(help="I/O threads of each served store")] = 4,
) -> None:
    """Serve the KV block store over TCP until SIGINT or SIGTERM; prints `listening on tcp://HOST:PORT`."""
    from ..runtime.store.remote import read_token
    from ..runtime.store.service import start_service

    host, port = parse_listen(listen)
    token = read_token(str(token_file)) if token_file else None
    if capacity_bytes is not None and capacity_bytes <= 0:
        raise InputError(f"--capacity-bytes must be > 0, got {capacity_bytes}")
    if threads < 1:
        raise InputError(f"--threads must be >= 1, got {threads}")
    try:
        handle = start_service(str(directory), host, port, token, capacity_bytes=capacity_bytes, num_threads=threads)
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    except OSError as exc:
        raise InputError(f"--listen {listen}: {exc.strerror or exc}") from exc
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    print(f"listening on {handle.url}", flush=True)
    stop.wait()
    handle.close()
