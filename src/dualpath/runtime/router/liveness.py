"""Which engines are alive: process exits at once, frozen engines by missed heartbeats.

  1. Every engine sends `Heartbeat` every `timeout / HEARTBEATS_PER_TIMEOUT` seconds from a thread
     of its own (engine/base.py); the router's receiver thread stamps each one (`Liveness.seen`),
     off the event loop, so a busy loop never makes a live engine look late.
  2. `ExitWatch` (a thread the cluster starts over its engine processes) waits on the processes'
     sentinels and reports an exit (SIGKILL, SIGTERM, a crash) within `EXIT_POLL_S`.
  3. The router checks `Liveness.overdue` every beat interval: an engine silent for longer than
     the timeout is frozen (SIGSTOP, a hung host).
  4. A dead or frozen engine is fenced for good (`Liveness.fence`): the cluster kills it (a frozen
     one would otherwise wake on SIGCONT and write into buffers that now belong to others), the
     router ignores its messages, and recovery.py ends or migrates its requests.
  5. Its id, not that process, may come back: a successor (a restarted Ray actor) that joins is
     re-admitted under the next incarnation (`Liveness.readmit`, membership.py); the fenced process
     stays cut off by its incarnation.

Pure bookkeeping except `ExitWatch`; times come from the router's clock.
"""

from __future__ import annotations

import signal
import threading
from multiprocessing.connection import wait as wait_for_sentinels
from typing import Any, Callable

# How long ExitWatch waits on the sentinels before it looks at its stop flag again: a process exit
# is still seen at once (the wait returns); this only bounds how long `stop()` takes.
EXIT_POLL_S = 0.1


class Liveness:
    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._last_seen_s: dict[int, float] = {}  # engine -> last heartbeat (receiver thread writes)
        self.down: dict[int, str] = {}  # fenced engine -> why (until a successor is re-admitted)
        self.incarnation: dict[int, int] = {}  # engine -> its holder's incarnation (0 first; membership.py)
        self.restarts: dict[int, int] = {}  # engine -> successors re-admitted

    def seen(self, engine: int, now_s: float) -> None:
        self._last_seen_s[engine] = now_s

    def is_alive(self, engine: int) -> bool:
        return engine not in self.down

    def overdue(self, engines: list[int], now_s: float) -> list[tuple[int, float]]:
        """(engine, seconds silent) for each live engine in `engines` silent for over the timeout."""
        out = []
        for e in engines:
            last = self._last_seen_s.get(e)
            if e not in self.down and last is not None and now_s - last > self.timeout_s:
                out.append((e, now_s - last))
        return out

    def readmit(self, engine: int, incarnation: int) -> None:
        """A successor holds fenced `engine` now (membership.py): alive again under `incarnation`."""
        self.down.pop(engine, None)
        self.incarnation[engine] = incarnation
        self.restarts[engine] = self.restarts.get(engine, 0) + 1

    def fence(self, engine: int, cause: str) -> bool:
        """Mark `engine` down for good; False if it already was (reports may come twice)."""
        if engine in self.down:
            return False
        self.down[engine] = cause
        return True


def exit_cause(exitcode: int | None) -> str:
    """A process's end in words: 'killed by SIGKILL', 'exited with code 1'."""
    if exitcode is None:
        return "exited"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class ExitWatch:
    """A thread that reports each watched process's exit once: `on_exit(engine, cause)`."""

    def __init__(self, processes: dict[int, Any], on_exit: Callable[[int, str], None]) -> None:
        self._procs = dict(processes)  # engine -> multiprocessing.Process (sentinel, join, exitcode)
        self._on_exit = on_exit
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="engine-exit-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before a planned shutdown: those exits are no faults)."""
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        by_sentinel = {p.sentinel: (e, p) for e, p in self._procs.items()}
        while by_sentinel and not self._stop.is_set():
            for s in wait_for_sentinels(list(by_sentinel), timeout=EXIT_POLL_S):
                engine, proc = by_sentinel.pop(s)
                proc.join(1.0)  # reap it, so the exit code is known
                if not self._stop.is_set():
                    self._on_exit(engine, exit_cause(proc.exitcode))


def engine_health(engines: dict[int, Any], liveness: Liveness) -> dict:
    """/health's view of the engines (EngineState by id): 'ok', 'degraded' (one is down, every
    role still has a live one) or 'unavailable' (a role has none: new requests get 503)."""
    roles = {str(e.role) for e in engines.values()}
    live = {str(e.role) for e in engines.values() if liveness.is_alive(e.engine)}
    status = "ok" if not liveness.down else "degraded" if live == roles else "unavailable"
    down = [{"engine": e, "role": str(engines[e].role) if e in engines else "unknown", "cause": c}
            for e, c in sorted(liveness.down.items())]
    return {"status": status, "engines": len(engines), "live_engines": sum(liveness.is_alive(e) for e in engines), "down": down,
            "restarts": {str(e): n for e, n in sorted(liveness.restarts.items())}}


def describe_down(engines: dict[int, Any], liveness: Liveness) -> str:
    """The fenced engines in words: 'decode engine 1 killed by SIGKILL, ...'."""
    return ", ".join(f"{d['role']} engine {d['engine']} {d['cause']}" for d in engine_health(engines, liveness)["down"])
