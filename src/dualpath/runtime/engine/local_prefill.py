"""A decode engine's own prefill of a short append (`+selective`, core/policy/local.py).

Numbered path of a local request on its DE (decode.py calls these):
  1. The hit lands in the request's DE-buffer region: read by the DE through its node's SNIC
     (decode.py step 1), or by a PE node that relays it (relay.py; `HitReady` with its write's
     sums). A block that fails its checksum ends the hit there; a relayed piece that fails its sum
     and the whole prompt is computed here.
  2. `prefill_into_region`: one forward over the uncached tokens, layer by layer, each layer's
     cached K,V read from the region and its new K,V written after them, so the region holds the
     prompt's KV as a PE's transfer would have left it.
  3. The first tokens are sampled by the PE's rule (logprobs.first_tokens, the same seeds) and go to
     the router (`FirstToken`); the request then loads into the KV cache and decodes as any other
     (decode.py step 3), without the transfer's checksums (its bytes never left this engine).
It runs on the engine's main thread between decode steps, never mid-step: the model is the step's.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..model import layer_kv_to_bytes
from ..model.kv_layout import LayerKV, layer_kv_from_bytes
from ..protocol import DecodeAssign
from ..transport.transfer import SpanCopy
from .kv_region import contiguous, layer_spans


def usable_hit_tokens(a: DecodeAssign, ok_blocks: int, block_tokens: int) -> int:
    """The assigned hit, shortened to its blocks that passed their checksums."""
    return min(a.hit_tokens, ok_blocks * block_tokens)


def prefill_into_region(engine: Any, a: DecodeAssign, hit_tokens: int) -> torch.Tensor:
    """Compute the KV of prompt tokens [hit_tokens, n) into the request's region of `engine`'s
    buffer, after the hit's, which is read from there; the logits of the prompt's last token [V]."""
    ids = list(a.prompt_ids)
    buf, layout = engine.buffers[engine.node], engine.layout
    tb = layout.kv_bytes_per_token_per_layer
    state = engine.model.begin_prefill([(hit_tokens, ids[hit_tokens:])])
    for layer in range(engine.mcfg.num_layers):
        cached = None
        if hit_tokens:
            raw = np.empty(hit_tokens * tb, dtype=np.uint8)
            SpanCopy(buf, layer_spans(layout, a.de_offsets, layer, 0, hit_tokens), raw, contiguous(0, raw.nbytes))(0, raw.nbytes)
            cached = LayerKV(layer_kv_from_bytes(raw, engine.mcfg, engine.dtype).kv.to(engine.model.dtype))
        (new,) = engine.model.prefill_layer(state, layer, [cached])
        data = np.frombuffer(layer_kv_to_bytes(new, engine.dtype), dtype=np.uint8)
        SpanCopy(data, contiguous(0, data.nbytes), buf, layer_spans(layout, a.de_offsets, layer, hit_tokens, len(ids)))(0, data.nbytes)
    return engine.model.finish_prefill(state)[0]
