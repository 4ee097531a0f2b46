"""Layerwise prefill with cached K,V (varlen batches) against full recompute."""

from __future__ import annotations

import pytest
import torch

from dualpath.runtime.model import (
    LayerKV,
    full_blocks_from_layer_kvs,
    layer_kv_from_bytes,
    layer_kv_from_full_blocks,
    layer_kv_to_bytes,
)

ATOL = 1e-4
BLOCK_TOKENS = 64


def _random_ids(model, lengths, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, model.config.vocab_size, (n,), generator=gen).tolist() for n in lengths]


def _cached_kv(model, seqs, cuts, routes):
    """Per layer, per item: the K,V of seq[:cut] from a previous prefill, passed along `route`
    ("tensor", "bytes": Layer Block bytes, "full_blocks": Full Blocks of BLOCK_TOKENS tokens)."""
    with_prefix = [i for i, c in enumerate(cuts) if c]
    prefix = model.prefill([(0, seqs[i][: cuts[i]]) for i in with_prefix])
    per_item = {i: [prefix.new_kv[l][j] for l in range(model.config.num_layers)] for j, i in enumerate(with_prefix)}
    blocks = {i: full_blocks_from_layer_kvs(per_item[i], BLOCK_TOKENS)
              for i in with_prefix if routes[i] == "full_blocks"}
    table = []
    for layer in range(model.config.num_layers):
        row = []
        for i, route in enumerate(routes):
            if not cuts[i]:
                row.append(None)
            elif route == "tensor":
                row.append(per_item[i][layer])
            elif route == "bytes":
                row.append(layer_kv_from_bytes(bytes(layer_kv_to_bytes(per_item[i][layer])), model.config, model.dtype))
            else:
                row.append(layer_kv_from_full_blocks(list(blocks[i]), layer, model.config, model.dtype))
        table.append(row)
    return table


def _check_varlen_prefill(model, seqs, cuts, routes):
    cached = _cached_kv(model, seqs, cuts, routes)
    state = model.begin_prefill([(c, s[c:]) for s, c in zip(seqs, cuts)])
    new_kv = [model.prefill_layer(state, layer, cached[layer]) for layer in range(model.config.num_layers)]
    logits = model.finish_prefill(state)
    assert logits.shape == (len(seqs), model.config.vocab_size)
    for i, (seq, cut) in enumerate(zip(seqs, cuts)):
        full = model.prefill([(0, seq)])
        assert (logits[i] - model(seq)[-1]).abs().max().item() <= ATOL
        assert (logits[i] - full.logits[0]).abs().max().item() <= ATOL
        for layer in (0, model.config.num_layers - 1):
            assert new_kv[layer][i].num_tokens == len(seq) - cut
            assert torch.allclose(new_kv[layer][i].kv, full.new_kv[layer][0].kv[cut:], atol=ATOL)


def test_smollm2_varlen_prefill_with_cached_kv(smollm2):
    model = smollm2.model
    seqs = _random_ids(model, [20, 70, 133, 66], seed=3)
    _check_varlen_prefill(model, seqs, cuts=[0, 64, 128, 64], routes=["tensor", "bytes", "full_blocks", "tensor"])


@pytest.mark.parametrize("route", ["tensor", "bytes", "full_blocks"])
def test_tiny_varlen_prefill_with_cached_kv(tiny, route):
    model = tiny.model
    seqs = _random_ids(model, [1, 65, 200, 129, 64 + 5], seed=4)
    _check_varlen_prefill(model, seqs, cuts=[0, 64, 192, 128, 64], routes=[route] * 5)


def test_layer_block_bytes_are_a_zero_copy_view(tiny):
    model, cfg = tiny.model, tiny.model.config
    (lkv,) = model.prefill([(0, [1, 2, 3, 4, 5])]).new_kv[0]
    raw = layer_kv_to_bytes(lkv)
    assert len(raw) == 5 * cfg.kv_bytes_per_token_per_layer(model.dtype)
    back = layer_kv_from_bytes(raw, cfg, model.dtype)
    assert back.kv.data_ptr() == lkv.kv.data_ptr()  # both directions are views
    assert torch.equal(back.k, lkv.kv[:, 0]) and torch.equal(back.v, lkv.kv[:, 1])
    half = layer_kv_to_bytes(lkv, dtype=torch.bfloat16)
    assert len(half) == len(raw) // 2
    assert torch.allclose(layer_kv_from_bytes(half, cfg, torch.bfloat16).kv.float(), lkv.kv, atol=0.05, rtol=0.01)


def test_full_block_layout_matches_block_layout(tiny):
    model, cfg = tiny.model, tiny.model.config
    seq = _random_ids(model, [130], seed=5)[0]
    per_layer = [kv[0] for kv in model.prefill([(0, seq)]).new_kv]
    blocks = full_blocks_from_layer_kvs(per_layer, BLOCK_TOKENS)
    layout = cfg.block_layout(model.dtype, BLOCK_TOKENS)
    assert blocks.shape == (2, layout.full_block_bytes)  # the trailing 2 tokens are no full block
    for layer in range(cfg.num_layers):
        lo, hi = layout.layer_range(layer)
        expect = layer_kv_to_bytes(per_layer[layer].slice_tokens(BLOCK_TOKENS, 2 * BLOCK_TOKENS))
        assert bytes(blocks[1, lo:hi].numpy()) == bytes(expect)


def test_prefill_misuse_is_refused(tiny):
    model = tiny.model
    state = model.begin_prefill([(2, [5, 6])])
    with pytest.raises(ValueError, match="in order"):
        model.prefill_layer(state, 1, [None])
    with pytest.raises(ValueError, match="cached tokens"):
        model.prefill_layer(state, 0, [None])
    with pytest.raises(ValueError, match="finish_prefill"):
        model.finish_prefill(state)
    with pytest.raises(ValueError):
        model.begin_prefill([(0, [])])
    wrong = LayerKV(torch.zeros(2, 2, 1, model.config.head_dim))
    with pytest.raises(ValueError, match="shape"):
        model.prefill_layer(state, 0, [wrong])
