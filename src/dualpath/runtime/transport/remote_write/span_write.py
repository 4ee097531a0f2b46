"""`RemoteSpanWrite`: the `do_chunk` that moves a span copy to another host, chunk by chunk.

The counterpart of transfer.SpanCopy across hosts. The source is a local host array; the
destination is a region of a segment the peer's `WriteTarget` registered (the `ShmRegion` an
engine already names in `LayerPull` or its PD offsets), with spans relative to that region. The
two span lists are cut at each other's boundaries by SpanCopy itself, so a piece is the same
aligned run in both worlds (and integrity.piece_sums works on either); `__call__(offset, n)`
sends the pieces overlapping that chunk of the logical stream as WRITE frames, so a `LinkArbiter`
interleaves lanes between chunks exactly as it does for a local copy.

Typical use, the DE answering a layer pull (what engine/decode.py does with SpanCopy today):

    job = RemoteSpanWrite(initiator, Lane.KV, buffer, spans, ShmRegion(seg, off, n), contiguous(0, n))
    submit_with_immediate(arbiter, job, lambda _res: encode(LayerReady(...)))

`submit_with_immediate` sends the completion message as an IMM on the job's lane once its last
chunk is sent, so the target sees it only after every byte of the job has landed.
"""

from __future__ import annotations

import bisect
from typing import Callable

import numpy as np

from ....core.lanes import Lane
from ..arbiter import LinkArbiter
from ..shm import ShmRegion
from ..transfer import SpanCopy, TransferHandle, TransferResult
from .initiator import WriteInitiator, byte_view


class RemoteSpanWrite:
    """Write the bytes of `src_spans` in `src` to `dst_spans` of the remote region `dst`, in order.
    Every destination span must lie inside the region ([0, dst.nbytes), half-open)."""

    def __init__(self, initiator: WriteInitiator, lane: Lane, src: np.ndarray, src_spans: list[tuple[int, int]],
                 dst: ShmRegion, dst_spans: list[tuple[int, int]]) -> None:
        for off, n in dst_spans:
            if off < 0 or n < 0 or off + n > dst.nbytes:
                raise ValueError(f"destination span [{off}, {off + n}) outside the region of {dst.nbytes} bytes")
        cut = SpanCopy(src, src_spans, None, dst_spans)  # only its piece cutting: dst is remote
        self.initiator, self.lane, self.src, self.dst = initiator, Lane(lane), src, dst
        self.nbytes = cut.nbytes
        self.pieces = cut.pieces  # (logical start, src offset, dst offset in the region, nbytes)
        self._starts = [p[0] for p in self.pieces]
        self._src_view = byte_view(src)
        if any(so < 0 or so + n > self._src_view.nbytes for _, so, _, n in self.pieces):
            raise ValueError("a source span lies outside the source array")

    def __call__(self, offset_bytes: int, nbytes: int) -> None:
        if offset_bytes < 0 or nbytes < 0 or offset_bytes + nbytes > self.nbytes:
            raise ValueError(f"bytes [{offset_bytes}, {offset_bytes + nbytes}) outside a write of {self.nbytes}")
        end = offset_bytes + nbytes
        base = self.dst.offset_bytes
        out: list[tuple[int, memoryview]] = []
        k = max(0, bisect.bisect_right(self._starts, offset_bytes) - 1)
        while k < len(self.pieces) and self._starts[k] < end:
            start, so, do, n = self.pieces[k]
            lo, hi = max(offset_bytes, start) - start, min(end, start + n) - start
            if hi > lo:
                out.append((base + do + lo, self._src_view[so + lo:so + hi]))
            k += 1
        self.initiator.write_many(self.lane, self.dst.segment, out)


def submit_with_immediate(arbiter: LinkArbiter, job: RemoteSpanWrite,
                          message: Callable[[TransferResult], bytes],
                          on_done: Callable[[TransferResult], None] | None = None) -> TransferHandle:
    """Queue `job` on `arbiter` in its lane; when its last chunk is sent, send `message(result)`
    as an IMM on the same lane (then call `on_done`). The callback runs on the link's thread; if the
    IMM cannot be sent (the lane broke after the last WRITE), the arbiter logs it and the handle
    still reports the transfer sent, so the receiver's own timeout must cover a missing IMM."""

    def done(result: TransferResult) -> None:
        job.initiator.immediate(job.lane, message(result))
        if on_done is not None:
            on_done(result)

    return arbiter.submit(job.lane, job.nbytes, job, done)

