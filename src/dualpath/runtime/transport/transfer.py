"""A transfer on a link: its handle, result and failure modes; the link's counters."""

from __future__ import annotations

import bisect
import ctypes
import logging
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ...core.lanes import Lane

log = logging.getLogger(__name__)

# (offset_bytes, nbytes) -> None: move bytes [offset, offset + nbytes) of the transfer.
DoChunk = Callable[[int, int], None]

_FINISH_LOCK = threading.Lock()
_memmove = ctypes.memmove  # a ctypes foreign call: releases the GIL while it copies


class ContiguousCopy:
    """`do_chunk` copying bytes [offset, offset + n) of `src` into `dst` (C-contiguous arrays of
    the same size in bytes) with one memmove: ~0.5 us per call against ~1.5 us for np.copyto on
    two slices, which counts at real speed where a link copies chunk by chunk. Holds the
    arrays, so their memory stays mapped while it lives."""

    __slots__ = ("dst", "src", "nbytes", "_dst_addr", "_src_addr")

    def __init__(self, dst: np.ndarray, src: np.ndarray) -> None:
        if not (dst.flags.c_contiguous and src.flags.c_contiguous):
            raise ValueError("ContiguousCopy needs C-contiguous arrays")
        if not dst.flags.writeable:
            raise ValueError("destination array is read-only")
        if dst.nbytes != src.nbytes:
            raise ValueError(f"source has {src.nbytes} bytes, destination {dst.nbytes}")
        self.dst, self.src, self.nbytes = dst, src, src.nbytes
        self._dst_addr, self._src_addr = dst.ctypes.data, src.ctypes.data

    def __call__(self, offset_bytes: int, nbytes: int) -> None:
        if offset_bytes < 0 or nbytes < 0 or offset_bytes + nbytes > self.nbytes:
            raise ValueError(f"bytes [{offset_bytes}, {offset_bytes + nbytes}) outside a copy of {self.nbytes}")
        _memmove(self._dst_addr + offset_bytes, self._src_addr + offset_bytes, nbytes)


def _copy(dst: Any, src: Any) -> None:
    """dst[:] = src for uint8 numpy arrays or torch tensors on any device (both release the GIL).

    Every copy, host <-> GPU included, has completed when this returns: the arbiter reports a
    transfer done right after its last chunk, and the bytes are then read (a persisted block) or
    their host region reused (a freed DE buffer region). Pinned host memory makes such a copy
    faster, not asynchronous."""
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        np.copyto(dst, src)
        return
    import torch

    d = torch.from_numpy(dst) if isinstance(dst, np.ndarray) else dst
    s = torch.from_numpy(src) if isinstance(src, np.ndarray) else src
    d.copy_(s, non_blocking=False)


class SpanCopy:
    """Copy the bytes of `src_spans` in `src` into `dst_spans` in `dst`, in order. Either side is a
    flat uint8 numpy array (host buffers) or torch tensor (a KV cache, possibly on a GPU: this is
    then the H2D or D2H copy of docs/paper.md §1.3).

    Both span lists are cut at each other's boundaries into aligned pieces once; `__call__`
    copies the pieces overlapping a chunk [offset, offset + nbytes) of the logical stream, so the
    arbiter can interleave lanes between chunks.
    """

    def __init__(self, src: Any, src_spans: list[tuple[int, int]], dst: Any, dst_spans: list[tuple[int, int]]) -> None:
        total_src = sum(n for _, n in src_spans)
        total_dst = sum(n for _, n in dst_spans)
        if total_src != total_dst:
            raise ValueError(f"source spans hold {total_src} bytes, destination spans {total_dst}")
        self.src, self.dst = src, dst
        self.nbytes = total_src
        self._starts: list[int] = []  # logical start of each piece
        self._pieces: list[tuple[int, int, int]] = []  # (src offset, dst offset, nbytes)
        i = j = 0
        si = di = 0  # bytes consumed of the current src / dst span
        pos = 0
        while pos < total_src:
            (so, sn), (do, dn) = src_spans[i], dst_spans[j]
            n = min(sn - si, dn - di)
            if n:
                self._starts.append(pos)
                self._pieces.append((so + si, do + di, n))
                pos += n
            si += n
            di += n
            if si == sn:
                i, si = i + 1, 0
            if di == dn:
                j, di = j + 1, 0

    @property
    def pieces(self) -> list[tuple[int, int, int, int]]:
        """(logical start, src offset, dst offset, nbytes) of each aligned piece, in stream order."""
        return [(start, so, do, n) for start, (so, do, n) in zip(self._starts, self._pieces)]

    def __call__(self, offset_bytes: int, nbytes: int) -> None:
        end = offset_bytes + nbytes
        k = max(0, bisect.bisect_right(self._starts, offset_bytes) - 1)
        while k < len(self._pieces) and self._starts[k] < end:
            so, do, n = self._pieces[k]
            lo = max(offset_bytes, self._starts[k]) - self._starts[k]
            hi = min(end, self._starts[k] + n) - self._starts[k]
            if hi > lo:
                _copy(self.dst[do + lo : do + hi], self.src[so + lo : so + hi])
            k += 1


class TransferFailed(RuntimeError):
    """A transfer's `do_chunk` raised, or the link closed before the transfer finished."""


class ArbiterClosed(RuntimeError):
    """`submit` on a closed link."""


@dataclass(frozen=True, slots=True)
class TransferResult:
    lane: Lane
    nbytes: int
    submitted_s: float
    started_s: float  # first chunk on the link
    completed_s: float  # last byte delivered (ideal link time when rate-limited)
    notified_s: float  # when the link's thread completed the handle (>= completed_s)

    @property
    def queue_delay_s(self) -> float:
        return self.started_s - self.submitted_s

    @property
    def latency_s(self) -> float:
        return self.completed_s - self.submitted_s


@dataclass(frozen=True, slots=True)
class LinkStats:
    """Snapshot of a link's counters, by submitted lane (Lane value order)."""

    name: str
    sent_bytes: tuple[int, int]
    queued_bytes: tuple[int, int]
    num_completed: tuple[int, int]
    total_queue_delay_s: tuple[float, float]
    max_queue_delay_s: tuple[float, float]
    busy_s: float  # link time spent sending chunks
    stalled_s: float  # link time lost because the link's thread fell more than max_lag_s behind


class TransferHandle:
    """Completion of one transfer; `wait()` returns its `TransferResult` or raises `TransferFailed`."""

    __slots__ = ("lane", "nbytes", "submitted_s", "_do_chunk", "_on_done", "_started_s", "_event", "_result", "_error")

    def __init__(self, lane: Lane, nbytes: int, submitted_s: float, do_chunk: DoChunk,
                 on_done: Callable[[TransferResult], None] | None) -> None:
        self.lane = lane
        self.nbytes = nbytes
        self.submitted_s = submitted_s
        self._do_chunk = do_chunk
        self._on_done = on_done
        self._started_s: float | None = None
        self._event = threading.Event()
        self._result: TransferResult | None = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout_s: float | None = None) -> TransferResult:
        if not self._event.wait(timeout_s):
            raise TimeoutError(f"transfer of {self.nbytes} bytes on {self.lane.name} not done after {timeout_s} s")
        if self._error is not None:
            raise TransferFailed(str(self._error)) from self._error
        assert self._result is not None
        return self._result

    def _finish(self, result: TransferResult | None, error: BaseException | None) -> bool:
        """Complete the handle (its `on_done` run); False if it was complete already."""
        with _FINISH_LOCK:  # close() and the link's thread may both finish a failing transfer
            if self._event.is_set():
                return False
            self._result, self._error = result, error
            self._do_chunk = _no_chunk  # drop references to caller buffers
            self._event.set()
        if result is not None and self._on_done is not None:
            try:
                self._on_done(result)
            except Exception:  # a callback must not kill the link; report it
                log.exception("on_done callback of a transfer failed")
        return True


def _no_chunk(offset_bytes: int, nbytes: int) -> None:
    raise TransferFailed("transfer already finished")
