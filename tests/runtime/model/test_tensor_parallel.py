"""Tensor parallelism over two ranks (model traffic for the latency-critical lane): rank 0 in this
process, rank 1 the real worker process over loopback gloo. The split MLP gives the same greedy tokens as one process,
its collectives carry the bytes the protocol says, and rank 1 never outlives rank 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from dualpath.runtime.model import PagedKVCache, load_model
from dualpath.runtime.model.loader import tiny_config
from dualpath.runtime.model.tensor_parallel import mlp_shards
from dualpath.runtime.model.tp_launch import TensorParallelError, TpPlacement, start_tensor_parallel

# float32 sums of two half-MLPs instead of one: reassociation only; the tiny model's logits are
# O(1-10), so 1e-4 absolute is ~1000x float32's epsilon at that scale and far below any greedy gap
LOGIT_TOLERANCE = 1e-4
# SmolLM2's logits reach ~30 over 30 layers: the same reassociation, scaled (measured max ~1e-4)
SMOLLM2_LOGIT_TOLERANCE = 1e-3
RENDEZVOUS_S = 60.0
PROMPT = (5, 17, 42, 99, 123, 7, 250, 3, 64, 81, 12, 200)


def _prefill_then_decode(model, steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Layerwise prefill of PROMPT (as the PE runs it), its KV into a paged cache, greedy decode steps."""
    result = model.prefill([(0, PROMPT)])
    cache = PagedKVCache(model.config, num_blocks=4, block_tokens=16, dtype=model.dtype)
    cache.load_prompt(0, [per_item[0] for per_item in result.new_kv])
    logits = [result.logits[0]]
    tokens = [int(result.logits[0].argmax())]
    for _ in range(steps):
        row = model.decode_step(cache, [0], [tokens[-1]])[0]
        logits.append(row)
        tokens.append(int(row.argmax()))
    return tokens, logits


def test_the_shards_sum_to_the_mlp():
    model = load_model("tiny", seed=3).model
    xn = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    halves = [mlp_shards(model, r)[2] for r in (0, 1)]
    assert halves[0].gate.shape == (model.config.intermediate_size // 2, model.config.hidden_size)
    torch.testing.assert_close(halves[0](xn) + halves[1](xn), model.blocks[2].mlp(xn), atol=1e-5, rtol=0)


def _tp2_matches_one_process(name: str, seed: int, tolerance: float) -> None:
    model = load_model(name, seed=seed).model
    want_tokens, want_logits = _prefill_then_decode(model, steps=6)
    tp = start_tensor_parallel(model, name, seed, 1, TpPlacement(), RENDEZVOUS_S)
    try:
        got_tokens, got_logits = _prefill_then_decode(model, steps=6)
        carried = tp.collectives.payload_bytes, tp.collectives.num_collectives
    finally:
        code = tp.close()
    assert got_tokens == want_tokens
    for got, want in zip(got_logits, want_logits):
        torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
    # 7 forwards (a prefill of 12 tokens, 6 decode steps of 1), each: header + 2 per layer
    c, layers = model.config.hidden_size, model.config.num_layers
    assert carried[1] == 7 * (1 + 2 * layers)
    assert carried[0] == 7 * 8 + 2 * layers * c * 4 * (len(PROMPT) + 6)
    assert code == 0 and all(b.mlp_hook is None for b in model.blocks)  # stopped cleanly, hooks removed


def test_tp2_gives_the_tokens_of_one_process_over_loopback_gloo():
    assert tiny_config(0).intermediate_size % 2 == 0  # 128: the tiny model splits
    _tp2_matches_one_process("tiny", 3, LOGIT_TOLERANCE)


@pytest.mark.slow
def test_smollm2_splits_and_gives_the_same_tokens():
    """SmolLM2-135M: intermediate 1536 splits into 768 + 768 (its 9 / 3 heads would not)."""
    _tp2_matches_one_process("smollm2-135m", 0, SMOLLM2_LOGIT_TOLERANCE)


def test_a_follower_that_cannot_start_is_a_clear_error():
    model = load_model("tiny", seed=3).model
    with pytest.raises(TensorParallelError, match="exited with code"):
        start_tensor_parallel(model, "no-such-model", 3, 1, TpPlacement(), RENDEZVOUS_S)
    assert all(b.mlp_hook is None for b in model.blocks)


_LEADER = textwrap.dedent("""
    import sys, time
    from dualpath.runtime.model import load_model
    from dualpath.runtime.model.tp_launch import TpPlacement, start_tensor_parallel
    model = load_model("tiny", seed=1).model
    tp = start_tensor_parallel(model, "tiny", 1, 1, TpPlacement(), 60.0)
    model.prefill([(0, (1, 2, 3))])
    print(tp.follower_pid, flush=True)
    time.sleep(600)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie has ended: only its parent has not reaped it yet
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_rank1_ends_when_rank0_is_killed():
    leader = subprocess.Popen([sys.executable, "-c", _LEADER], stdout=subprocess.PIPE, text=True)
    try:
        follower_pid = int(leader.stdout.readline())
        assert _alive(follower_pid)
        leader.send_signal(signal.SIGKILL)
        leader.wait()
        deadline = time.monotonic() + 10
        while _alive(follower_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(follower_pid)
    finally:
        leader.kill()
        leader.wait()
