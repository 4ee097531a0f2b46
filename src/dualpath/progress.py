"""Progress of the long commands (`demo`, `run`, `sim`, `repro`): a live rich bar on a terminal,
throttled plain lines anywhere else (a log file, a pipe, CI).

A plain line names the command, the mode, work done out of total, seconds since the reporter
started and, for the runtime commands, each node's SNIC read utilisation over the interval since
the previous line of that mode ("-" while unknown):

    demo basic: 24/60 turns, 12.0 s, SNIC util PE0 0.97 (29 MB/s), DE1 0.00 (0 MB/s)

Contract: at most one line per `interval_s` while a mode runs, plus one line when a mode ends
(its work is all done, the next mode starts, or the reporter closes); no control codes; the
stream is flushed after every line (a redirected stdout is block buffered). Time comes from an
injected clock, so tests drive the throttle without sleeping.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

DEFAULT_INTERVAL_S = 5.0
# Engines report their counters every 0.5 s (engine/base.py maybe_report_counters): a shorter window
# would measure the reports, not the SNIC, so a line that comes sooner widens its window back.
MIN_SNIC_WINDOW_S = 1.0


def _default_clock() -> Callable[[], float]:
    from .runtime.clock import MonotonicClock  # the one module that reads the OS clock

    return MonotonicClock().now_s


@dataclass(slots=True)
class SnicWindow:
    """Storage bytes read per node since the window opened; `describe` closes it and opens the next
    (or, under `MIN_SNIC_WINDOW_S`, reaches back to where the previous one opened).

    The counters are cumulative within a mode (engines reset them when the mode changes)."""

    snic_bytes_per_s: float | None
    start_s: float | None = None
    start_bytes: dict[str, int] = field(default_factory=dict)
    last_bytes: dict[str, int] = field(default_factory=dict)
    prev_start_s: float | None = None  # where the previous window began
    prev_start_bytes: dict[str, int] = field(default_factory=dict)

    def observe(self, now_s: float, storage_read_bytes: Mapping[str, int]) -> None:
        if self.start_s is None:
            self.start_s, self.start_bytes = now_s, dict(storage_read_bytes)
        self.last_bytes = dict(storage_read_bytes)

    def describe(self, now_s: float) -> str:
        """`SNIC util <node> <util> (<MB/s>), ...` over the window, then a new window from now."""
        start_s, start = self.start_s, self.start_bytes
        if start_s is not None and now_s - start_s < MIN_SNIC_WINDOW_S and self.prev_start_s is not None:
            start_s, start = self.prev_start_s, self.prev_start_bytes
        self.prev_start_s, self.prev_start_bytes = start_s, start
        self.start_s, self.start_bytes = now_s, dict(self.last_bytes)
        if start_s is None or now_s <= start_s or not self.last_bytes:
            return "SNIC util -"
        parts = []
        for node, nbytes in self.last_bytes.items():
            read_bytes_per_s = (nbytes - start.get(node, 0)) / (now_s - start_s)
            util = "-" if not self.snic_bytes_per_s else f"{read_bytes_per_s / self.snic_bytes_per_s:.2f}"
            parts.append(f"{node} {util} ({read_bytes_per_s / 1e6:.0f} MB/s)")
        return "SNIC util " + ", ".join(parts)


@dataclass(slots=True)
class _Mode:
    done: int
    total: int
    snic: SnicWindow | None
    ended: bool = False


class PlainProgress:
    """Throttled plain lines on `stream` (see the module docstring for the contract)."""

    def __init__(self, command: str, unit: str, stream: TextIO, *, clock: Callable[[], float] | None = None,
                 interval_s: float = DEFAULT_INTERVAL_S, snic_bytes_per_s: float | None = None) -> None:
        self.command, self.unit, self.stream, self.interval_s = command, unit, stream, interval_s
        self.clock = clock or _default_clock()
        self.snic_bytes_per_s = snic_bytes_per_s
        self.start_s = self.clock()
        self.last_line_s = self.start_s
        self.modes: dict[str, _Mode] = {}
        self.current: str | None = None

    def update(self, mode: str, done: int, total: int, storage_read_bytes: Mapping[str, int] | None = None) -> None:
        """`done` of `total` in `mode`; `storage_read_bytes` (runtime only) is cumulative per node."""
        now = self.clock()
        if self.current is not None and self.current != mode:
            self.end_mode(self.current)
        self.current = mode
        m = self.modes.get(mode)
        if m is None or (m.ended and done < total):  # a new mode, or the same one run again
            m = self.modes[mode] = _Mode(done, total, None if storage_read_bytes is None else SnicWindow(self.snic_bytes_per_s))
        m.done, m.total = done, total
        if m.snic is not None and storage_read_bytes is not None:
            m.snic.observe(now, storage_read_bytes)
        if done >= total:
            self.end_mode(mode)
        elif now - self.last_line_s >= self.interval_s:
            self._line(mode, now)

    def end_mode(self, mode: str) -> None:
        """The final line of `mode`, once."""
        m = self.modes.get(mode)
        if m is not None and not m.ended:
            m.ended = True
            self._line(mode, self.clock())

    def log(self, text: str) -> None:
        self._write(f"{self.command}: {text}")

    def close(self) -> None:
        for mode in self.modes:
            self.end_mode(mode)

    def _line(self, mode: str, now_s: float) -> None:
        m = self.modes[mode]
        text = f"{self.command} {mode}: {m.done}/{m.total} {self.unit}, {now_s - self.start_s:.1f} s"
        if m.snic is not None:
            text += ", " + m.snic.describe(now_s)
        self.last_line_s = now_s
        self._write(text)

    def _write(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LiveProgress:
    """The same interface as `PlainProgress` over a transient rich bar per mode (a terminal)."""

    def __init__(self, command: str, unit: str, console: Console, *, clock: Callable[[], float] | None = None,
                 snic_bytes_per_s: float | None = None) -> None:
        self.command, self.unit = command, unit
        self.clock = clock or _default_clock()
        self.snic_bytes_per_s = snic_bytes_per_s
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("{task.fields[snic]}"), console=console, transient=True)
        self.tasks: dict[str, TaskID] = {}
        self.snic: dict[str, SnicWindow] = {}
        self.snic_text_s: dict[str, float] = {}

    def update(self, mode: str, done: int, total: int, storage_read_bytes: Mapping[str, int] | None = None) -> None:
        if mode not in self.tasks:
            self.tasks[mode] = self.progress.add_task(f"{self.command} {mode} ({self.unit})", total=total, snic="")
            self.snic_text_s[mode] = self.clock()
        self.progress.update(self.tasks[mode], completed=done, total=total)
        if storage_read_bytes is not None:
            now = self.clock()
            window = self.snic.setdefault(mode, SnicWindow(self.snic_bytes_per_s))
            window.observe(now, storage_read_bytes)
            if now - self.snic_text_s[mode] >= 1.0:  # a readable rate: not one per turn
                self.snic_text_s[mode] = now
                self.progress.update(self.tasks[mode], snic=window.describe(now))

    def end_mode(self, mode: str) -> None:
        pass

    def log(self, text: str) -> None:
        self.progress.console.print(f"{self.command}: {text}", markup=False, highlight=False)

    def close(self) -> None:
        pass

    def __enter__(self) -> LiveProgress:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()


Reporter = PlainProgress | LiveProgress


def reporter(command: str, unit: str, console: Console, *, stream: TextIO | None = None,
             snic_bytes_per_s: float | None = None, clock: Callable[[], float] | None = None,
             interval_s: float = DEFAULT_INTERVAL_S) -> Reporter:
    """A live bar on `console` when `stream` (default stdout) is a terminal, else plain lines on it."""
    stream = sys.stdout if stream is None else stream
    if stream.isatty():
        return LiveProgress(command, unit, console, clock=clock, snic_bytes_per_s=snic_bytes_per_s)
    return PlainProgress(command, unit, stream, clock=clock, interval_s=interval_s, snic_bytes_per_s=snic_bytes_per_s)
