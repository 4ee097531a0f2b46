"""Our SmolLM2 against transformers' LlamaForCausalLM loaded from the same GGUF (float32)."""

from __future__ import annotations

import pytest
import torch

from dualpath.runtime.model import generate

LOGIT_ATOL = 1e-3

SAMPLES = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 12345 apples, 3.14159!",
    "naïve café, Straße, 東京タワー, Москва, 🙂🚀 emoji",
    "def f(x):\n    return x ** 2  # square\n\n\tif x != 0: print(f'{x=}')",
    "   leading spaces,  double  spaces,\n\n\nnewlines\r\n and trailing   ",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "don't won't I'm we'll they've it's O'Neil 'quoted'",
    "<file_sep><repo_name>x<|endoftext|>< |im_start|>",
    "a" * 300 + " " * 100 + "ab" * 150,
    "",
]


@pytest.mark.parametrize("num_tokens", [1, 9, 70])
def test_logits_match_transformers(smollm2, hf_smollm2, num_tokens):
    hf_model, _ = hf_smollm2
    gen = torch.Generator().manual_seed(num_tokens)
    ids = torch.randint(0, smollm2.model.config.vocab_size, (num_tokens,), generator=gen)
    ours = smollm2.model(ids)
    with torch.no_grad():
        ref = hf_model(ids[None]).logits[0]
    assert ours.shape == ref.shape == (num_tokens, smollm2.model.config.vocab_size)
    assert (ours - ref).abs().max().item() <= LOGIT_ATOL


def test_greedy_chat_answer_matches_transformers(smollm2, hf_smollm2):
    hf_model, _ = hf_smollm2
    tok = smollm2.tokenizer
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    ids = tok.encode(prompt)
    ours = generate(smollm2.model, tok, ids, max_tokens=20)
    with torch.no_grad():
        ref = hf_model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                max_new_tokens=20, do_sample=False, pad_token_id=tok.pad_token_id)
    assert list(ours.generated_ids) == ref[0, len(ids):].tolist()
    assert "Paris" in ours.text


@pytest.mark.parametrize("text", SAMPLES)
def test_tokenizer_matches_transformers(smollm2, hf_smollm2, text):
    _, hf_tok = hf_smollm2
    ids = smollm2.tokenizer.encode(text)
    assert ids == hf_tok.encode(text, add_special_tokens=False)
    assert smollm2.tokenizer.decode(ids) == text
    assert smollm2.tokenizer.decode(ids, skip_special=True) == hf_tok.decode(ids, skip_special_tokens=True)


def test_bytes_without_a_token_are_dropped_like_transformers(smollm2, hf_smollm2):
    _, hf_tok = hf_smollm2
    for text in ("a\x04b", "\U00040000 x", "tab\there\x1d"):
        assert smollm2.tokenizer.encode(text) == hf_tok.encode(text, add_special_tokens=False)


def test_chat_template_matches_transformers(smollm2, hf_smollm2):
    _, hf_tok = hf_smollm2
    conversation = [
        {"role": "user", "content": "Name a prime number."},
        {"role": "assistant", "content": "7 is prime."},
        {"role": "user", "content": "And an even one?"},
    ]
    for add_prompt in (True, False):
        ours = smollm2.tokenizer.apply_chat_template(conversation, add_generation_prompt=add_prompt)
        ref = hf_tok.apply_chat_template(conversation, tokenize=False, add_generation_prompt=add_prompt)
        assert ours == ref
    system = [{"role": "system", "content": "Be brief."}, *conversation[:2]]
    assert smollm2.tokenizer.apply_chat_template(system) == hf_tok.apply_chat_template(
        system, tokenize=False, add_generation_prompt=True)
