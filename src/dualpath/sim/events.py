"""Event loop of the simulator: a heap keyed (time_s, priority, seq).

Tie rule (the one documented rule): events at the same time run in ascending `priority`, then in
the order they were scheduled (`seq`, a counter owned by this loop, never global). Completions
(priority 0) therefore run before arrivals (1), and both before scheduling passes (2) and metric
samples (3), so a scheduling pass at time t sees every state change that happened at t.

Cancellation is lazy: a handler that may be superseded carries a version and ignores stale calls.
"""

from __future__ import annotations

import heapq
from heapq import heappush
from typing import Any, Callable

PRIO_COMPLETE = 0
PRIO_ARRIVAL = 1
PRIO_SCHEDULE = 2
PRIO_SAMPLE = 3
_INF = float("inf")


class EventLoop:
    __slots__ = ("now_s", "_heap", "_seq", "num_events", "halted")

    def __init__(self) -> None:
        self.now_s = 0.0
        self._heap: list[tuple[float, int, int, Callable[..., Any], Any]] = []
        self._seq = 0
        self.num_events = 0
        self.halted = False  # set by `halt()`; ends `run(stop_when_halted=True)` after the current event

    def halt(self) -> None:
        self.halted = True

    def call_at(self, time_s: float, fn: Callable[[Any], Any], arg: Any = None, priority: int = PRIO_COMPLETE) -> None:
        if time_s < self.now_s:
            raise ValueError(f"cannot schedule in the past: {time_s} < {self.now_s}")
        seq = self._seq + 1
        self._seq = seq
        heappush(self._heap, (time_s, priority, seq, fn, arg))

    def run(self, until_s: float = float("inf"), stop: Callable[[], bool] | None = None, stop_when_halted: bool = False) -> None:
        """Run events in order until the heap is empty, the next event lies past `until_s`, `stop()`
        turns true after an event, or (with `stop_when_halted`) an event called `halt()`. The
        flag is cheaper than a `stop` callable, which costs a call per event."""
        heap = self._heap
        pop = heapq.heappop
        n = 0
        if stop is None and until_s == _INF:  # the common case (an offline run), with the checks it needs only
            while heap:
                t, _, _, fn, arg = pop(heap)
                self.now_s = t
                fn(arg)
                n += 1
                if stop_when_halted and self.halted:
                    break
            self.num_events += n
            return
        while heap:
            if heap[0][0] > until_s:
                self.now_s = max(self.now_s, until_s)
                break
            t, _, _, fn, arg = pop(heap)
            self.now_s = t
            fn(arg)
            n += 1
            if stop is not None and stop():
                break
            if stop_when_halted and self.halted:
                break
        else:
            if until_s != _INF:
                self.now_s = max(self.now_s, until_s)  # the clock reaches the horizon
        self.num_events += n

    @property
    def pending(self) -> int:
        return len(self._heap)
