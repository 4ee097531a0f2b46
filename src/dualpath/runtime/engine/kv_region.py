"""Where a prompt's KV bytes live in a host buffer, and copies between such places.

A prompt of n tokens occupies ceil(n / block_tokens) Full Block slots of a node's host buffer
(any slots, one per block, in `offsets`); slot b holds tokens [b * bt, (b + 1) * bt) as a Full
Block: num_layers Layer Blocks back to back, each [bt, 2 (K, V), kv_heads, head_dim] (core.blocks).
So layer l of a token range is a list of contiguous spans, at most one per block.

The spans are what `transport.transfer.SpanCopy` moves, chunk by chunk, as a `LinkArbiter`
transfer calls it.
"""

from __future__ import annotations

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
