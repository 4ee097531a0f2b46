"""`PagedKVCache.fork`: a choice of the same prompt shares the prompt's full blocks (no copy) and
owns a copy of the partly filled one; each sequence decodes as if it were alone; a shared block is
never written; blocks return only when no sequence holds them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.runtime.model import LayerKV, PagedKVCache
from dualpath.runtime.model.generate import prefill_into_cache
from dualpath.runtime.model.loader import tiny_config
from dualpath.runtime.model.paged_cache import OutOfBlocksError


def test_a_fork_shares_the_full_blocks_and_copies_the_partial_one(tiny):
    model = tiny.model
    cache = PagedKVCache(model.config, 16, 64)
    prefill_into_cache(model, cache, 0, list(range(1, 151)), 2048)  # 150 tokens: 2 full blocks + 22
    free_before = cache.num_free_blocks
    cache.fork(0, 1)
    assert cache.num_free_blocks == free_before - 1  # only the partial block is new
    parent, child = cache.block_table(0), cache.block_table(1)
    assert child[:2] == parent[:2] and child[2] != parent[2] and cache.num_tokens(1) == 150
    assert cache.shared_blocks(0) == cache.shared_blocks(1) == 2
    for layer in range(model.config.num_layers):
        assert torch.equal(cache.read(1, layer).kv, cache.read(0, layer).kv)
    cache.check_invariants()
    with pytest.raises(ValueError, match="another sequence holds"):
        cache.write(1, 0, 10, LayerKV(torch.zeros(1, 2, model.config.num_kv_heads, model.config.head_dim)))


def test_forked_choices_decode_as_if_alone(tiny):
    """Three choices of one prompt decoded in one batch give the logits each gets from a cache of
    its own (prompt prefilled again, no sharing)."""
    model = tiny.model
    prompt = list(range(3, 3 + 130))
    shared = PagedKVCache(model.config, 32, 64)
    logits = prefill_into_cache(model, shared, 0, prompt, 2048)
    shared.fork(0, 1)
    shared.fork(0, 2)
    firsts = [int(logits.argmax()), 7, 11]  # each choice's own first token
    steps = [firsts, [20, 21, 22], [30, 31, 32]]
    got = [model.decode_step(shared, [0, 1, 2], toks) for toks in steps]
    for c in range(3):
        alone = PagedKVCache(model.config, 8, 64)
        prefill_into_cache(model, alone, 0, prompt, 2048)
        for s, toks in enumerate(steps):
            ref = model.decode_step(alone, [0], [toks[c]])[0]
            assert torch.allclose(got[s][c], ref, atol=1e-5), (c, s)
    shared.check_invariants()


@settings(max_examples=60, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["add", "fork", "decode", "free"]), st.integers(0, 5),
                              st.integers(0, 5), st.integers(0, 9)), max_size=40),
       block_tokens=st.sampled_from([1, 2, 4]), num_blocks=st.integers(1, 16))
def test_the_ledger_holds_under_random_forks(ops, block_tokens, num_blocks):
    """Every sequence reads back exactly its own values (its parent's before the fork, its own
    after), whatever was forked, decoded or freed; refusals change nothing; when every sequence is
    gone every block is free."""
    cfg = tiny_config(0)
    cache = PagedKVCache(cfg, num_blocks, block_tokens)
    shadow: dict[int, list[float]] = {}
    stamp = iter(range(1, 10**6))

    def kv(values: list[float]) -> torch.Tensor:
        return torch.tensor(values)[:, None, None, None].expand(-1, 2, cfg.num_kv_heads, cfg.head_dim)

    for op, a, b, n in ops:
        before = (cache.num_free_blocks, {s: list(v) for s, v in shadow.items()})
        try:
            if op == "add" and a not in shadow:
                cache.add_sequence(a, n)
                values = [float(next(stamp)) for _ in range(n)]
                if n:
                    cache.write(a, 1, 0, LayerKV(kv(values)))
                shadow[a] = values
            elif op == "fork" and a in shadow and b not in shadow:
                cache.fork(a, b)
                shadow[b] = list(shadow[a])
            elif op == "decode" and shadow:
                batch = sorted(shadow)[: n % len(shadow) + 1]
                decode = cache.prepare_decode(batch)
                values = [float(next(stamp)) for _ in batch]
                for layer in range(cfg.num_layers):  # a step writes every layer
                    cache.write_decode(decode, layer, kv(values))
                for s, v in zip(batch, values):
                    shadow[s].append(v)
            elif op == "free" and a in shadow:
                cache.free(a)
                del shadow[a]
        except OutOfBlocksError:
            assert (cache.num_free_blocks, shadow) == before  # a refused allocation changes nothing
        cache.check_invariants()
        for s, values in shadow.items():
            assert cache.read(s, 1).kv[:, 0, 0, 0].tolist() == values
    for s in list(shadow):
        cache.free(s)
    assert cache.num_free_blocks == num_blocks
