"""Logits from KV loaded out of the store equal recompute (allclose 1e-4), and a block that fails
its checksum is treated as a miss and recomputed, never used (in-process, no engine processes)."""

import torch

from dualpath.core.blocks import BlockLayout, chain_digests
from dualpath.runtime.model import load_model, layer_kv_from_full_blocks, full_blocks_from_layer_kvs
from dualpath.runtime.store import BlockStore


def test_prefill_over_store_loaded_kv_matches_recompute(tmp_path):
    m = load_model("tiny").model
    cfg = m.config
    bt = 64
    prompt = list(range(3, 3 + 200))
    tail = list(range(50, 90))
    layout = BlockLayout(cfg.num_layers, bt, cfg.kv_bytes_per_token_per_layer(torch.float32))
    store = BlockStore(tmp_path, layout, cfg.fingerprint(torch.float32), "float32")
    # turn 1: prefill, persist its full blocks
    pre = m.prefill([(0, prompt)])
    nfull = len(prompt) // bt
    blocks = full_blocks_from_layer_kvs([layer[0] for layer in pre.new_kv], bt)[:nfull]
    digests = chain_digests(prompt, bt)
    for d, b in zip(digests, blocks):
        store.put(d, b.numpy().tobytes())
    # turn 2: load the hit from the store, prefill only the miss
    full = prompt + tail
    hit = store.lookup(chain_digests(full, bt)) * bt
    assert hit == nfull * bt
    buf = torch.empty((nfull, layout.full_block_bytes), dtype=torch.uint8)
    assert store.read_into(chain_digests(full, bt)[:nfull], buf.numpy()) == nfull
    cached = [[layer_kv_from_full_blocks(buf, l, cfg, torch.float32, "cpu")] for l in range(cfg.num_layers)]
    logits = m.prefill([(hit, full[hit:])], cached).logits[0]
    ref = m.forward(full)[-1]
    assert torch.allclose(logits, ref, atol=1e-4)


def test_a_corrupted_block_is_a_miss(tmp_path):
    m = load_model("tiny").model
    cfg = m.config
    layout = BlockLayout(cfg.num_layers, 64, cfg.kv_bytes_per_token_per_layer(torch.float32))
    store = BlockStore(tmp_path, layout, cfg.fingerprint(torch.float32), "float32")
    prompt = list(range(3, 3 + 192))
    pre = m.prefill([(0, prompt)])
    blocks = full_blocks_from_layer_kvs([layer[0] for layer in pre.new_kv], 64)
    digests = chain_digests(prompt, 64)
    for d, b in zip(digests, blocks):
        store.put(d, b.numpy().tobytes())
    # flip one payload byte of the second block on disk
    path = next(p for p in tmp_path.rglob("*") if p.is_file() and digests[1].hex() in p.name)
    raw = bytearray(path.read_bytes())
    raw[-100] ^= 0xFF
    path.write_bytes(bytes(raw))
    buf = torch.empty((3, layout.full_block_bytes), dtype=torch.uint8)
    assert store.read_into(digests, buf.numpy()) == 1  # the prefix stops before the bad block
    assert store.lookup(digests) == 1  # and the bad block is gone from the index
