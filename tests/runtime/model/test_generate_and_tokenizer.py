"""Generation (prefill + paged decode) and tokenizer properties that need no reference library."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.errors import InputError
from dualpath.runtime.model import generate, generate_text, load_model

PROMPT = [257, 72, 105, 33, 10, 258, 50, 51]


def _greedy_by_recompute(model, prompt, num_tokens):
    seq = list(prompt)
    for _ in range(num_tokens):
        seq.append(int(model(seq)[-1].argmax()))
    return seq[len(prompt):]


@pytest.mark.parametrize("chunk_tokens", [3, 2048])
def test_greedy_generate_equals_recompute(tiny, chunk_tokens):
    out = generate(tiny.model, tiny.tokenizer, PROMPT, max_tokens=12, stop_at_eos=False,
                   block_tokens=4, prefill_chunk_tokens=chunk_tokens)
    assert list(out.generated_ids) == _greedy_by_recompute(tiny.model, PROMPT, 12)
    assert out.prompt_ids == tuple(PROMPT) and not out.stopped_at_eos


def test_sampling_is_deterministic_for_a_seed(tiny):
    runs = [generate(tiny.model, tiny.tokenizer, PROMPT, 16, temperature=1.0, top_p=0.9, seed=s, stop_at_eos=False)
            for s in (5, 5, 6)]
    assert runs[0].generated_ids == runs[1].generated_ids != runs[2].generated_ids


def test_generate_stops_at_eos():
    own = load_model("tiny")  # not the shared fixture: its weights are edited here
    eos = own.model.config.eos_token_ids[0]
    own.model.lm_head.weight.data[eos] += 100.0  # make EOS the only choice
    out = generate(own.model, own.tokenizer, PROMPT, max_tokens=5)
    assert out.generated_ids == (eos,) and out.stopped_at_eos and out.text == ""


def test_generate_text_inputs():
    out = generate_text("tiny", prompt="hi", max_tokens=3)
    assert len(out.generated_ids) <= 3
    assert out.prompt_ids[:1] == (257,)  # <|im_start|> from the chat template
    assert generate_text("tiny", prompt_ids=[1, 2, 3], max_tokens=2).prompt_ids == (1, 2, 3)
    with pytest.raises(InputError):
        generate_text("tiny", max_tokens=2)
    with pytest.raises(InputError):
        generate_text("tiny", prompt_ids=[1, 99999], max_tokens=2)
    with pytest.raises(InputError):
        generate_text("tiny", prompt="x", temperature=-1.0)


@settings(max_examples=50, deadline=None)
@given(text=st.text(max_size=60))
def test_byte_tokenizer_round_trips_any_text(tiny, text):
    assert tiny.tokenizer.decode(tiny.tokenizer.encode(text)) == text


# SmolLM2 has no token for some bytes (ASCII controls such as 0x04, UTF-8 lead bytes 0xF1/0xF2);
# text without them round-trips
_SMOLLM2_TEXT = st.text(st.characters(max_codepoint=0xFFFF, exclude_categories=("Cc", "Cs")), max_size=60)


@settings(max_examples=50, deadline=None)
@given(text=_SMOLLM2_TEXT)
def test_smollm2_tokenizer_round_trips_text(smollm2, text):
    assert smollm2.tokenizer.decode(smollm2.tokenizer.encode(text)) == text


def test_added_tokens_are_atomic_unless_disabled(smollm2):
    tok = smollm2.tokenizer
    assert tok.encode("<|im_start|>") == [1]
    plain = tok.encode("<|im_start|>", allow_added_tokens=False)
    assert 1 not in plain and tok.decode(plain) == "<|im_start|>"
    assert tok.decode([1, 2], skip_special=True) == ""


def test_long_inputs_encode_in_near_linear_time(smollm2):
    tok = smollm2.tokenizer
    words = "Agents resend a growing context every turn; 95-99% of it was computed before.\n"
    start = time.perf_counter()
    ids = tok.encode(words * 3000)  # ~60K tokens
    assert len(ids) > 40_000
    for run in ("a" * 30_000, " " * 30_000, "ab" * 15_000):  # single huge pieces: no quadratic merging
        tok.clear_cache()
        assert tok.decode(tok.encode(run)) == run
    assert time.perf_counter() - start < 20.0  # generous: about 1 s on one core
