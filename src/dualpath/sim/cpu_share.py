"""One machine's cores shared by an engine's compute and its own I/O: the `local` preset's decode
steps slow down while their engine moves KV.

On the local runtime cluster an engine is one process: its decode loop computes on the engine's
cores while its threads copy KV (H2D of a prompt, the layer stream to a PE, D2H of a block to
persist), read blocks from the store and write them, checksumming every piece. On the dev
workloads a decode step overlapped by such I/O of its own engine took 1.2-1.8x a step without it
(`dualpath fidelity`'s timelines; fidelity/speed.py fits the factor on calibration runs). So a
decode group's steps take `1 + decode_io_slowdown` times their measured time while its node moves
KV: a flow on the node's SNIC or on one of its engines' CNICs (links.py watchers), or a block
being written to storage (`io_span`, from persists.py). A step already running is stretched from
the change on (fluid progress, decode.py); a join waiting for the step's end keeps the time it was
given, so it may come a fraction of a step early or late.

Chosen once (`cpu_share_for`): the paper presets' GPUs compute apart from their NICs, and a `local`
preset without a measured slowdown gets `NO_CPU_SHARE`, which schedules and slows nothing.
"""

from __future__ import annotations

from typing import Callable

from ..config import SimConfig
from .events import PRIO_COMPLETE, EventLoop


class CpuShare:
    def __init__(self, loop: EventLoop, decode_io_slowdown: float) -> None:
        self.loop = loop
        self.decode_io_slowdown = decode_io_slowdown
        self._writes: dict[int, int] = {}  # node id -> blocks being written now
        self._watchers: dict[int, list[Callable[[], None]]] = {}

    def slows_decode(self) -> bool:
        return True

    def watch(self, node_id: int, fn: Callable[[], None]) -> None:
        """`fn()` whenever the node's writes start or stop."""
        self._watchers.setdefault(node_id, []).append(fn)

    def writing(self, node_id: int) -> bool:
        return self._writes.get(node_id, 0) > 0

    def io_span(self, node_id: int, start_s: float, end_s: float) -> None:
        """A block is written to storage from the node over [start_s, end_s)."""
        start_s = max(start_s, self.loop.now_s)  # a block that filled earlier is written from now on
        if end_s > start_s:
            self.loop.call_at(start_s, self._write, (node_id, 1), PRIO_COMPLETE)
            self.loop.call_at(end_s, self._write, (node_id, -1), PRIO_COMPLETE)

    def _write(self, node_delta: tuple[int, int]) -> None:
        node_id, delta = node_delta
        before = self._writes.get(node_id, 0)
        self._writes[node_id] = before + delta
        if self._writes[node_id] < 0:
            raise AssertionError(f"node {node_id}: a write ended that never started")
        if (before == 0) != (self._writes[node_id] == 0):
            for fn in self._watchers.get(node_id, ()):
                fn()


class NoCpuShare(CpuShare):
    """Compute apart from I/O: decode steps take their measured time."""

    def __init__(self) -> None:
        super().__init__(EventLoop(), 0.0)

    def slows_decode(self) -> bool:
        return False

    def io_span(self, node_id: int, start_s: float, end_s: float) -> None:
        pass


NO_CPU_SHARE = NoCpuShare()


def cpu_share_for(cfg: SimConfig, loop: EventLoop) -> CpuShare:
    """The run's machine, chosen once: shared cores for a `local` preset with a measured decode
    slowdown, nothing shared otherwise."""
    if cfg.local is not None and cfg.local.decode_io_slowdown > 0:
        return CpuShare(loop, cfg.local.decode_io_slowdown)
    return NO_CPU_SHARE
