"""Messages that reach a decode engine while its decode step runs.

On the paper's DE the layer streams of the DE read path (docs/paper.md §1.3) are RDMA writes by the
node's CNIC: they do not wait for the GPU to finish a decode step. This runtime's DE has one control
loop, so without help a `LayerPull` that arrives during a step waits for the step's end, and a PE
that pulls its cached KV layer by layer waits up to one decode step per layer. The decode step
therefore calls `poll` between its layers: a message that `serve_now` accepts (a pull, a finished
read or copy of a live request: engine/decode.py) is handled at once; every other message waits, in
arrival order, for `drain` after the step. Two orders are kept:

- per request: once one of a request's messages waits, its later ones wait behind it;
- for the engine: a message of no request (an `EngineDown`, a `Reconfigure`, `Stop`) is a barrier,
  so everything after it waits too.
"""

from __future__ import annotations

import time
from typing import Any, Callable


class StepInterleave:
    def __init__(self, recv: Callable[[], Any | None], serve_now: Callable[[Any], bool],
                 handle: Callable[[Any], None]) -> None:
        self._recv = recv  # the next message, or None at once when none is queued
        self._serve_now = serve_now
        self._handle = handle
        self._waiting: list[Any] = []
        self._waiting_rids: set[int] = set()
        self._barrier = False
        self._served = 0  # messages handled between layers in this step
        self.serve_s = 0.0  # seconds spent handling them, all steps (the DE's model time excludes it)

    def poll(self, _layer: int = -1) -> None:
        """Between two layers of a step: serve what may be served now, keep the rest."""
        while (msg := self._recv()) is not None:
            rid = getattr(msg, "rid", None)
            if not self._barrier and rid is not None and rid not in self._waiting_rids and self._serve_now(msg):
                t0 = time.perf_counter()
                self._handle(msg)
                self.serve_s += time.perf_counter() - t0
                self._served += 1
                continue
            self._waiting.append(msg)
            if rid is None:
                self._barrier = True
            else:
                self._waiting_rids.add(rid)

    def drain(self) -> int:
        """After the step: the kept messages, in the order they arrived. Returns how many the
        step served between its layers."""
        served, self._served = self._served, 0
        waiting, self._waiting = self._waiting, []
        self._waiting_rids.clear()
        self._barrier = False
        for msg in waiting:
            self._handle(msg)
        return served
