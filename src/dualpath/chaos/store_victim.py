"""The storage service as a chaos victim (chaos/matrix.py): `dualpath store serve` in a child
process on loopback, with a shared token, that a scenario signals at its moment.

What a request sees when the service dies (SIGKILL, SIGTERM) or freezes (SIGSTOP) mid-turn:
  1. a lookup or a read that fails is a miss: the PE recomputes the hit (the same tokens, greedy);
  2. a persist that fails is skipped (`Persisted.stored` False, counted in the router's metrics);
  3. a dead service refuses connections at once; a frozen one costs each client one
     `store_timeout_s` (RuntimeConfig), after which its circuit breaker skips calls
     (store/breaker.py). So a request in flight is terminal within its fault-free time plus
     STORE_CALLS_ON_PATH x store_timeout_s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from ..errors import InputError

# The calls on one request's path that can each wait a timeout on a frozen service: the router's
# placement lookup and the engine's read of its hit (a persist never holds a request back).
STORE_CALLS_ON_PATH = 2
# `store serve` prints its address once bound; a start of the CLI (typer, the store) takes ~1-2 s
SERVICE_START_TIMEOUT_S = 60.0
SERVICE_TOKEN = b"chaos-scenario-token"  # loopback only; the token path is exercised all the same


class ServiceChild:
    """`python -m dualpath.cli store serve` on 127.0.0.1 (a free port), its directory and token
    file in a private temporary directory; `url` is what RuntimeConfig.store.location takes."""

    def __init__(self) -> None:
        self._tmp = tempfile.mkdtemp(prefix="dp-chaos-svc-")
        token_file = os.path.join(self._tmp, "token")
        with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(SERVICE_TOKEN)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dualpath.cli", "store", "serve", "--dir", os.path.join(self._tmp, "store"),
             "--listen", "127.0.0.1:0", "--token-file", token_file, "--threads", "1"],
            stdout=subprocess.PIPE, text=True)
        line = self._first_line()
        if not line.startswith("listening on tcp://"):
            self.close()
            raise InputError(f"the storage service did not start: {line.strip() or 'no output'}")
        self.url = f"{line.split()[-1]}?token_file={token_file}"

    def _first_line(self) -> str:
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(SERVICE_START_TIMEOUT_S)
        sel.close()
        return self.proc.stdout.readline() if ready else ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, sig: int) -> None:
        try:
            os.kill(self.proc.pid, sig)
        except ProcessLookupError:
            pass  # already gone (a kill or term before)

    def close(self) -> None:
        """SIGCONT (a frozen service wakes to die), SIGKILL, reap, remove its files."""
        self.send(signal.SIGCONT)
        self.send(signal.SIGKILL)
        self.proc.wait(30)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> "ServiceChild":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
