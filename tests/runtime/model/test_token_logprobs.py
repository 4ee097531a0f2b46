"""Raw logprobs of a sampled token and the top k (engine/logprobs.py), their wire form, and the
bytes a token stands for (Tokenizer.token_bytes), which the server spells them with."""

from __future__ import annotations

import pytest
import torch

from dualpath.runtime.api import NO_LOGPROBS, TokenLogprobs
from dualpath.runtime.engine.logprobs import token_logprobs, wire_logprobs


def test_values_are_log_softmax_of_the_raw_logits_top_first():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0, -5.0])
    lp = token_logprobs(logits, 2, 3)
    ref = torch.log_softmax(logits, dim=-1)
    assert lp.logprob == pytest.approx(ref[2].item())
    assert [t for t, _ in lp.top] == [1, 3, 2]
    assert [v for _, v in lp.top] == pytest.approx([ref[1].item(), ref[3].item(), ref[2].item()])
    assert sum(torch.exp(torch.tensor([v for _, v in token_logprobs(logits, 0, 5).top]))).item() == pytest.approx(1.0)
    assert token_logprobs(logits, 4, 0).top == ()
    with pytest.raises(ValueError, match="top"):
        token_logprobs(logits, 0, 21)


def test_the_wire_form_round_trips_and_none_is_empty():
    lp = token_logprobs(torch.tensor([1.0, 2.0, 0.5]), 0, 2)
    assert TokenLogprobs.from_wire(lp.to_wire()) == lp
    assert wire_logprobs(torch.tensor([1.0, 2.0]), 0, NO_LOGPROBS) == [] and TokenLogprobs.from_wire([]) is None
    assert TokenLogprobs.from_wire(wire_logprobs(torch.tensor([1.0, 2.0]), 1, 1)) == token_logprobs(
        torch.tensor([1.0, 2.0]), 1, 1)


def test_a_bf16_row_is_taken_in_float32():
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    lp = token_logprobs(logits, 7, 1)
    assert lp.logprob == pytest.approx(torch.log_softmax(logits.float(), dim=-1)[7].item(), abs=1e-6)


def test_token_bytes_are_each_tokens_own_bytes(smollm2, tiny):
    text = "naïve café, 日本語 🙂 <|im_end|> plain"
    tok = smollm2.tokenizer
    ids = tok.encode(text)
    pieces = [tok.token_bytes(i) for i in ids]
    assert b"".join(pieces) == text.encode()
    assert any(len(p) == 1 and p[0] >= 0x80 for p in pieces)  # a token holding part of a character
    assert tok.token_bytes(tok.encode("<|im_end|>")[0]) == b"<|im_end|>"  # an added token: its content
    assert tiny.tokenizer.token_bytes(0xE6) == b"\xe6" and tiny.tokenizer.token_bytes(65) == b"A"
