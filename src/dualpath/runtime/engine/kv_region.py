"""Where a prompt's KV bytes live in a host buffer, and copies between such places.

A prompt of n tokens occupies ceil(n / block_tokens) Full Block slots of a node's host buffer
(any slots, one per block, in `offsets`); slot b holds tokens [b * bt, (b + 1) * bt) as a Full
Block: num_layers Layer Blocks back to back, each [bt, 2 (K, V), kv_heads, head_dim] (core.blocks).
So layer l of a token range is a list of contiguous spans, at most one per block.

`SpanCopy` moves the bytes of one span list into another of the same total size, chunk by chunk,
as a `LinkArbiter` transfer calls it (`do_chunk(offset, nbytes)` over the logical byte stream).
"""

from __future__ import annotations

import bisect
from typing import Any
import numpy as np

from ...core.blocks import BlockLayout


def layer_spans(layout: BlockLayout, offsets: list[int], layer: int, start: int, stop: int) -> list[tuple[int, int]]:
    """(byte offset in the segment, nbytes) of layer `layer` for tokens [start, stop) of a prompt
    whose block b sits at `offsets[b]` (a Full Block, `core.blocks.BlockLayout`)."""
    bt = layout.block_tokens
    if not 0 <= start <= stop <= len(offsets) * bt:
        raise ValueError(f"tokens [{start}, {stop}) outside the {len(offsets)} blocks of the region")
    layer_start = layout.layer_range(layer)[0]
    tb = layout.kv_bytes_per_token_per_layer
    spans = []
    t = start
    while t < stop:
        b, inside = divmod(t, bt)
        n = min(stop - t, bt - inside)
        spans.append((offsets[b] + layer_start + inside * tb, n * tb))
        t += n
    return spans


def contiguous(offset_bytes: int, nbytes: int) -> list[tuple[int, int]]:
    return [(offset_bytes, nbytes)] if nbytes else []


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
    then the H2D or D2H copy of PAPER.md 1.3).

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
