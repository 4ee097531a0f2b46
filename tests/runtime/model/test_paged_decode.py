"""Paged decode with continuous batching against full recompute, and the PagedKVCache ledger."""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dualpath.runtime.model import LayerKV, OutOfBlocksError, PagedKVCache, layer_kv_to_bytes
from dualpath.runtime.model.loader import tiny_config

ATOL = 1e-4


def _run_continuous_batching(model, prompts, schedule, block_tokens, num_blocks):
    """schedule[step] = sequences in that step's batch. A sequence joins (prefill, then its K,V are
    loaded into the cache through Layer Block bytes) at its first step and leaves after its last.
    Returns {seq: (tokens, [logits of each decode step])} with the greedy tokens appended."""
    cache = PagedKVCache(model.config, num_blocks, block_tokens, dtype=model.dtype)
    seqs, step_logits, last_step = {}, {}, {}
    for step, batch in enumerate(schedule):
        for s in batch:
            last_step[s] = step
    for step, batch in enumerate(schedule):
        for s in batch:
            if s not in seqs:
                res = model.prefill([(0, prompts[s])])
                cache.load_prompt_bytes(s, [bytes(layer_kv_to_bytes(kv[0])) for kv in res.new_kv])
                seqs[s] = [*prompts[s], int(res.logits[0].argmax())]
                step_logits[s] = []
        logits = model.decode_step(cache, batch, [seqs[s][-1] for s in batch])
        for s, row in zip(batch, logits):
            step_logits[s].append(row)
            seqs[s].append(int(row.argmax()))
            if last_step[s] == step:
                cache.free(s)
        cache.check_invariants()
    assert cache.num_free_blocks == num_blocks  # every block came back
    return {s: (seqs[s], step_logits[s]) for s in seqs}


def _check_against_recompute(model, prompts, runs):
    for s, (tokens, logits) in runs.items():
        ref = model(tokens[:-1])  # one full recompute gives the reference logits of every step
        n = len(prompts[s])
        assert int(ref[n - 1].argmax()) == tokens[n]
        for k, row in enumerate(logits):
            assert (row - ref[n + k]).abs().max().item() <= ATOL
            assert int(ref[n + k].argmax()) == tokens[n + k + 1]


def test_tiny_continuous_batching_matches_recompute(tiny):
    model = tiny.model
    gen = torch.Generator().manual_seed(7)
    prompts = {s: torch.randint(0, 256, (n,), generator=gen).tolist() for s, n in enumerate([3, 9, 17, 4, 30])}
    schedule = [[0, 1], [0, 1], [1, 0, 2], [2, 1, 0], [2, 3], [3, 2, 4], [4, 3], [4, 3], [4], [4, 3]]
    runs = _run_continuous_batching(model, prompts, schedule, block_tokens=4, num_blocks=40)
    _check_against_recompute(model, prompts, runs)


def test_smollm2_continuous_batching_matches_recompute(smollm2):
    model = smollm2.model
    tok = smollm2.tokenizer
    texts = ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time"]
    prompts = dict(enumerate(tok.encode(t) for t in texts))
    schedule = [[0, 1], [0, 1], [1, 2, 0], [2, 1], [3, 2], [2, 3], [3]]
    runs = _run_continuous_batching(model, prompts, schedule, block_tokens=4, num_blocks=32)
    _check_against_recompute(model, prompts, runs)


def test_decode_refuses_when_out_of_blocks(tiny):
    model = tiny.model
    cache = PagedKVCache(model.config, num_blocks=2, block_tokens=2, dtype=model.dtype)
    res = model.prefill([(0, [1, 2, 3, 4])])
    cache.load_prompt(0, [kv[0] for kv in res.new_kv])
    with pytest.raises(OutOfBlocksError):
        model.decode_step(cache, [0], [5])
    assert cache.num_tokens(0) == 4  # unchanged
    cache.check_invariants()


# ---- the ledger under random operations -------------------------------------------------------

_OPS = st.lists(
    st.tuples(st.sampled_from(["add", "extend", "decode", "free"]), st.integers(0, 5), st.integers(0, 13)),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@example(ops=[("add", 0, 0), ("add", 1, 0), ("decode", 0, 1), ("extend", 0, 0), ("decode", 0, 1)], block_tokens=1,
         num_blocks=4, workspace=True)  # a write outside a step moves seq 1 to row 0: rows no longer in batch order
@given(ops=_OPS, block_tokens=st.sampled_from([1, 2, 4]), num_blocks=st.integers(1, 12), workspace=st.booleans())
def test_paged_cache_conservation_under_random_ops(ops, block_tokens, num_blocks, workspace):
    """The ledger, every sequence's values and what a decode step reads hold under random adds,
    writes, extends, steps and frees, with the decode workspace (whose rows check_invariants
    compares with the blocks after every operation) and without."""
    cfg = tiny_config(0)
    cache = PagedKVCache(cfg, num_blocks, block_tokens, workspace=workspace)
    shadow: dict[int, int] = {}  # seq -> tokens written so far, each holding the value seq*1000 + position

    def fill(seq, start, stop):
        values = torch.arange(start, stop, dtype=torch.float32) + 1000 * seq
        cache.write(seq, 1, start, LayerKV(values[:, None, None, None].expand(-1, 2, cfg.num_kv_heads, cfg.head_dim)))

    for op, seq, n in ops:
        before = (cache.num_free_blocks, dict(shadow))
        try:
            if op == "add" and seq not in shadow:
                cache.add_sequence(seq, n)
                fill(seq, 0, n)
                shadow[seq] = n
            elif op == "extend" and seq in shadow:
                cache.extend(seq, n)
                fill(seq, shadow[seq], shadow[seq] + n)
                shadow[seq] += n
            elif op == "decode" and shadow:
                batch = sorted(shadow)[: n % len(shadow) + 1]
                decode = cache.prepare_decode(batch)
                kv_new = decode.positions.float() + 1000 * torch.tensor(batch, dtype=torch.float32)
                for layer in range(cfg.num_layers):  # a step writes every layer
                    cache.write_decode(decode, layer, kv_new[:, None, None, None].expand(-1, 2, cfg.num_kv_heads, cfg.head_dim))
                for s in batch:
                    shadow[s] += 1
                # what attention reads: each sequence's values, in order; from the workspace its rows are in
                # row order (`decode.rows[i]`: the batch's i-th sequence's row; attend permutes around them)
                k, v = cache.gather_decode(decode, 1)
                rows = range(len(batch)) if decode.rows is None else decode.rows.tolist()
                assert sorted(rows) == list(range(len(batch)))
                for row, s in zip(rows, batch):
                    want = torch.arange(shadow[s], dtype=torch.float32) + 1000 * s
                    assert torch.equal(k[row, 0, : shadow[s], 0], want) and torch.equal(v[row, 0, : shadow[s], 0], want)
            elif op == "free" and seq in shadow:
                assert cache.free(seq) == cache.blocks_for_tokens(shadow.pop(seq))
        except OutOfBlocksError:
            assert (cache.num_free_blocks, dict(shadow)) == before  # a refused allocation changes nothing
        cache.check_invariants()
        for s, count in shadow.items():
            assert cache.num_tokens(s) == count
            got = cache.read(s, 1).kv[:, 0, 0, 0]
            assert torch.equal(got, torch.arange(count, dtype=torch.float32) + 1000 * s)  # no block aliasing


def test_after_layer_hook_runs_between_layers_and_changes_nothing(tiny):
    """The decode engine serves its mail between a step's layers (engine/mid_step.py): the hook runs
    once per layer, in order, and the logits and cache are the same as without it."""
    model = tiny.model
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    caches, logits = [], []
    for hook in (None, "record"):
        cache = PagedKVCache(model.config, num_blocks=8, block_tokens=4, dtype=model.dtype)
        res = model.prefill([(0, prompt)])
        cache.load_prompt(0, [kv[0] for kv in res.new_kv])
        seen: list[int] = []
        logits.append(model.decode_step(cache, [0], [7], seen.append if hook else None))
        caches.append(cache)
        if hook:
            assert seen == list(range(model.config.num_layers))
    assert torch.equal(logits[0], logits[1])
    assert torch.equal(caches[0].kv, caches[1].kv)


# ---- the decode workspace ---------------------------------------------------------------------


def test_the_workspace_and_the_gather_give_attention_the_same_logits(tiny):
    """Continuous batching (joins, leaves, reorders) with the batch's K,V kept in the workspace and
    with every block gathered each step: the same logits, step for step."""
    model = tiny.model
    gen = torch.Generator().manual_seed(11)
    prompts = {s: torch.randint(0, 256, (n,), generator=gen).tolist() for s, n in enumerate([5, 13, 2, 21])}
    schedule = [[0, 1], [0, 1], [0, 1], [2, 0, 1], [1, 2], [1, 2, 3], [3, 1], [3, 1], [3]]
    runs = {}
    for workspace in (True, False):
        cache = PagedKVCache(model.config, 48, 4, dtype=model.dtype, workspace=workspace)
        tokens = {}
        logits = []
        for batch in schedule:
            for s in batch:
                if s not in tokens:
                    res = model.prefill([(0, prompts[s])])
                    cache.load_prompt(s, [kv[0] for kv in res.new_kv])
                    tokens[s] = [int(res.logits[0].argmax())]
            logits.append(model.decode_step(cache, batch, [tokens[s][-1] for s in batch]))
            for s, row in zip(batch, logits[-1]):
                tokens[s].append(int(row.argmax()))
            cache.check_invariants()
        runs[workspace] = logits
    for with_ws, without in zip(runs[True], runs[False]):
        torch.testing.assert_close(with_ws, without, atol=1e-6, rtol=0)


def test_the_workspace_copies_only_the_sequences_that_join_or_change(tiny):
    """A sequence is gathered from its blocks when it joins the batch, and again only after it was
    written outside a step or left; a reorder or another sequence leaving moves no sequence's KV in
    from the blocks."""
    model = tiny.model
    cfg = model.config
    cache = PagedKVCache(cfg, 32, 4, dtype=model.dtype)
    for s, prompt in enumerate([[1, 2, 3], [4, 5, 6, 7, 8], [9, 10]]):
        cache.load_prompt(s, [kv[0] for kv in model.prefill([(0, prompt)]).new_kv])
    ws = cache._workspace
    b = cache.prepare_decode([0, 1])
    assert ws.gathered == 2 and b.rows.tolist() == [0, 1] and ws.lengths == [4, 6]
    assert cache.workspace_bytes == ws.nbytes > 0
    cache.prepare_decode([0, 1])
    b = cache.prepare_decode([1, 0])  # another order: the rows stay, the queries are permuted
    assert ws.gathered == 2 and b.rows.tolist() == [1, 0]
    cache.prepare_decode([1, 0, 2])  # a join: that one sequence gathered
    assert ws.gathered == 3
    b = cache.prepare_decode([2, 1])  # 0 left: its row taken by the last one
    assert ws.gathered == 3 and sorted(b.rows.tolist()) == [0, 1]
    cache.write(1, 0, 0, LayerKV(torch.ones(1, 2, cfg.num_kv_heads, cfg.head_dim)))  # outside a step
    b = cache.prepare_decode([2, 1])
    assert ws.gathered == 4  # 1 gathered again, with what was written
    assert torch.equal(ws.kv[0, b.rows[1], 0], torch.ones(2, cfg.num_kv_heads, cfg.head_dim))
    cache.check_invariants()
    cache.free(2)
    cache.check_invariants()
    assert ws.seq_of == [1] and PagedKVCache(cfg, 4, 4, workspace=False).workspace_bytes == 0


def test_a_batch_too_long_for_the_workspace_is_gathered_and_decodes_the_same(tiny):
    """The rows never hold more positions than the block pool: a batch that would need more reads
    by the gather that step (no rows), and gives the logits of a cache without a workspace."""
    model = tiny.model
    prompts = [list(range(1, 30)), [5, 6], [7, 8, 9]]
    logits = {}
    for workspace in (True, False):
        cache = PagedKVCache(model.config, 12, 4, dtype=model.dtype, workspace=workspace)  # 48 positions
        for s, p in enumerate(prompts):
            cache.load_prompt(s, [kv[0] for kv in model.prefill([(0, p)]).new_kv])
        solo = cache.prepare_decode([1])
        assert (solo.rows is not None) == workspace  # 1 row of 3 positions (and spare blocks): fits
        wide = cache.prepare_decode([0, 1, 2])
        assert wide.rows is None  # 3 rows of 30 positions: over 48
        assert cache.workspace_bytes <= cache.kv.numel() * cache.kv.element_size()
        for s in range(3):
            cache.free(s)
        for s, p in enumerate(prompts):
            cache.load_prompt(s, [kv[0] for kv in model.prefill([(0, p)]).new_kv])
        logits[workspace] = [model.decode_step(cache, [1, 2], [3, 4]), model.decode_step(cache, [0, 1, 2], [5, 6, 7]),
                             model.decode_step(cache, [2, 1], [8, 9])]
        cache.check_invariants()
    for a, b in zip(logits[True], logits[False]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
