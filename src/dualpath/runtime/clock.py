"""Time for the runtime: the only module that reads the OS clock (STYLE.md habit 2).

Everything else takes a `Clock`: `now_s()` (monotonic seconds) and `sleep_s()`. Tests inject
`ManualClock` to make rate limiting and timeouts deterministic.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float: ...

    def sleep_s(self, seconds: float) -> None: ...


class MonotonicClock:
    """Wall time from `time.monotonic` (never jumps backwards)."""

    def now_s(self) -> float:
        return time.monotonic()

    def sleep_s(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class ManualClock:
    """A clock that moves only when told to; `sleep_s` advances it (single-threaded tests) or
    waits for `advance` from another thread when `blocking` is set."""

    def __init__(self, start_s: float = 0.0, blocking: bool = False) -> None:
        self._now = start_s
        self._blocking = blocking
        self._cv = threading.Condition()

    def now_s(self) -> float:
        with self._cv:
            return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time only moves forward")
        with self._cv:
            self._now += seconds
            self._cv.notify_all()

    def sleep_s(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if not self._blocking:
            self.advance(seconds)
            return
        with self._cv:
            target = self._now + seconds
            while self._now < target:
                self._cv.wait()
