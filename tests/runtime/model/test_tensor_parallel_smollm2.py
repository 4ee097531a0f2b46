"""SmolLM2-135M split over two ranks (rank 1 a real worker process over loopback gloo) gives the
greedy tokens of one process, in the default run: the session's loaded SmolLM2 (conftest.py) is
rank 0, a 12-token prompt and two decode steps keep it to three forwards, so rank 1's start-up
(a Python with torch, SmolLM2 loaded from its GGUF) is most of the cost. The six-step version with
the collectives' byte count is `slow` in test_tensor_parallel.py."""

from __future__ import annotations

import torch
from test_tensor_parallel import PROMPT, RENDEZVOUS_S, SMOLLM2_LOGIT_TOLERANCE, _prefill_then_decode

from dualpath.runtime.model.tp_launch import TpPlacement, start_tensor_parallel

DECODE_STEPS = 2


def test_smollm2_tp2_gives_the_tokens_of_one_process(smollm2):
    model = smollm2.model
    assert model.config.intermediate_size % 2 == 0  # 1536 splits into 768 + 768 (its 9 / 3 heads would not)
    want_tokens, want_logits = _prefill_then_decode(model, steps=DECODE_STEPS)
    tp = start_tensor_parallel(model, "smollm2-135m", 0, 1, TpPlacement(), RENDEZVOUS_S)
    try:
        got_tokens, got_logits = _prefill_then_decode(model, steps=DECODE_STEPS)
        num_collectives = tp.collectives.num_collectives
    finally:
        code = tp.close()
    assert len(got_tokens) == DECODE_STEPS + 1 and got_tokens == want_tokens
    for got, want in zip(got_logits, want_logits):
        torch.testing.assert_close(got, want, atol=SMOLLM2_LOGIT_TOLERANCE, rtol=0)
    # the split really ran: each forward (a prefill of PROMPT, then one per step) a header + 2 per layer
    assert len(PROMPT) == 12 and num_collectives == (DECODE_STEPS + 1) * (1 + 2 * model.config.num_layers)
    assert code == 0 and all(b.mlp_hook is None for b in model.blocks)  # stopped cleanly, the shared model restored
