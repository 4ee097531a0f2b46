"""An engine told to end (SIGTERM) says so before it goes (engine/leave.py): the router hears
`Leaving` from the process's current holder and fences it at once (router/membership.py
`on_leaving`, tests/runtime/cluster/test_membership.py); the process still ends by SIGTERM, so its exit reads as before."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

from dualpath.runtime.engine import leave
from dualpath.runtime.protocol import Leaving


def _child(q) -> None:
    leave.install(3, 2, to_router=q.put, close=lambda: q.put("closed"))
    q.put("ready")
    while True:
        time.sleep(0.05)  # the main thread busy elsewhere: the handler only starts the leaving thread


def _get(q, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while q.empty():
        assert time.monotonic() < deadline, "nothing came from the child"
        time.sleep(0.01)
    return q.get()


def test_sigterm_sends_leaving_then_ends_by_sigterm():
    ctx = mp.get_context("fork")
    q = ctx.SimpleQueue()  # put writes the pipe at once: nothing waits in a feeder thread when the child ends
    p = ctx.Process(target=_child, args=(q,), daemon=True)
    p.start()
    try:
        assert _get(q, 30) == "ready"
        os.kill(p.pid, signal.SIGTERM)
        p.join(30)
        assert p.exitcode == -signal.SIGTERM  # ended by the signal after all
        assert [_get(q, 5), _get(q, 5)] == [Leaving(3, 2), "closed"]  # sent, then flushed
    finally:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)


def test_install_is_refused_off_the_main_thread():
    import threading

    before, got = signal.getsignal(signal.SIGTERM), []
    t = threading.Thread(target=lambda: got.append(leave.install(0, 0, print, print)))
    t.start()
    t.join()
    assert got == [False] and signal.getsignal(signal.SIGTERM) is before
