"""An engine told to end (SIGTERM: an operator, an orchestrator's stop, Ray's graceful kill) says so
before it goes, so the router moves its requests at once (router/membership.py `on_leaving`). Without
it the router learns of the end from the engine's process on one host (the cluster's exit watch)
and, for an engine on another host, only after a heartbeat timeout.

The handler runs in the main thread between two bytecodes, possibly while that thread holds the
lock of the router's outbox, so it only starts a thread; the thread sends `Leaving`, closes the
outbox and waits LEAVE_GRACE_S (zmq sends a closed socket's last messages from its I/O thread,
after close() returns, so the process must outlive that; the router usually fences it first, by
SIGKILL), then ends the process by SIGTERM after all (the handler has put the default action
back; the thread raises the signal again), so its exit reads as before.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Any, Callable

from ..protocol import Leaving

# The Outbox's linger (transport/channel.py): what a closed socket is given to flush. Measured: a
# PE told to end mid-forward without it was heard by the router 0 times in 4 (its requests moved
# after the heartbeat timeout instead: `dualpath chaos --testbed --scenario pe-term-prefill`).
LEAVE_GRACE_S = 1.0


def _die_by_sigterm() -> None:
    time.sleep(LEAVE_GRACE_S)
    os.kill(os.getpid(), signal.SIGTERM)  # the default action is back (install's handler): the process ends


def install(engine: int, incarnation: int, to_router: Callable[[Any], None], close: Callable[[], None],
            end: Callable[[], None] = _die_by_sigterm) -> bool:
    """SIGTERM -> Leaving to the router, then the end; False (nothing installed) off the main
    thread. A second SIGTERM while it leaves ends the process at once."""
    if threading.current_thread() is not threading.main_thread():
        return False

    def leave() -> None:
        try:
            print(f"engine {engine}: SIGTERM, leaving (telling the router)", file=sys.stderr, flush=True)
            to_router(Leaving(engine, incarnation))
            close()
        finally:
            end()

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # only the main thread may set a handler
        threading.Thread(target=leave, name="leaving", daemon=True).start()

    signal.signal(signal.SIGTERM, on_sigterm)
    return True
