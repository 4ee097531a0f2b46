"""Logprobs through a real cluster (SmolLM2, real engine processes, a real store), read with the
official `openai` client: every sampled token's logprob and its top 5 equal a `transformers`
forward over the same ids within 1e-3, the first token (sampled on the prefill engine) included,
streaming and not, on a turn computed from scratch and on one whose prefix was loaded from the
store through the decode engine's read path; at temperature 1 they are still the raw ones; n = 4
choices come from one prefill, the same four for the same seed."""

import time
import warnings

import openai
import pytest
import torch

from dualpath.config import EngineConfig, RuntimeConfig
from persist_wait import wait_block_files
from serve_thread import serve_in_thread

LOGPROB_ATOL = 1e-3  # the acceptance's bound; our logits match transformers' to 1e-3 (test_llama_vs_transformers.py)
MODEL = "smollm2-135m"


@pytest.fixture(scope="module")
def reference():
    """ids -> transformers' log-probabilities of every next token [len(ids), V] (float32, same GGUF)."""
    transformers = pytest.importorskip("transformers")
    from dualpath.runtime.model.loader import smollm2_gguf_path

    transformers.logging.set_verbosity_error()
    path = smollm2_gguf_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                              dtype=torch.float32).eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.no_grad():
            return torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)

    return logprobs


@pytest.fixture(scope="module")
def served():
    """A SmolLM2 cluster whose every hit is read through the decode engine (the new path)."""
    cfg = RuntimeConfig(model=MODEL, force_read_side="decode",
                        engines=EngineConfig(host_buffer_bytes=64 * 2**20, pe_hbm_bytes=64 * 2**20, de_kv_tokens=4096))
    with serve_in_thread(cfg) as (url, cluster):
        yield openai.OpenAI(base_url=url, api_key="unused"), cluster


@pytest.fixture(scope="module")
def tokenizer():
    from dualpath.runtime.model import load_model

    return load_model(MODEL).tokenizer


def check_against(reference, tokenizer, prompt_ids: list[int], generated: list[int], content) -> None:
    """Each entry of chat's `logprobs.content` against the forward over prompt + generated: the
    sampled token's logprob, the top 5's values, and the top 5's tokens where no tie within the
    tolerance could order them otherwise."""
    ref = reference(prompt_ids + generated)
    assert len(content) == len(generated) > 0
    for i, (token, entry) in enumerate(zip(generated, content)):
        row = ref[len(prompt_ids) - 1 + i]
        assert abs(entry.logprob - row[token].item()) <= LOGPROB_ATOL, (i, entry.logprob, row[token].item())
        assert bytes(entry.bytes) == tokenizer.token_bytes(token)
        values, ids = row.topk(6)
        assert len(entry.top_logprobs) == 5
        for j, top in enumerate(entry.top_logprobs):
            assert abs(top.logprob - values[j].item()) <= LOGPROB_ATOL
            apart = values[j] - values[j + 1] > 2 * LOGPROB_ATOL and (j == 0 or values[j - 1] - values[j] > 2 * LOGPROB_ATOL)
            if apart:
                assert bytes(top.bytes) == tokenizer.token_bytes(ids[j].item())


def ask(client, messages, stream: bool, **kw):
    """(prompt ids, generated ids, logprobs content, usage) of one chat request."""
    body = dict(model=MODEL, messages=messages, max_tokens=10, logprobs=True, top_logprobs=5,
                extra_body={"return_token_ids": True}, **kw)
    if not stream:
        r = client.chat.completions.create(**body)
        return r.model_extra["prompt_token_ids"], r.choices[0].model_extra["token_ids"], r.choices[0].logprobs.content, r.usage
    prompt, generated, content, usage = None, [], [], None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body):
        prompt = chunk.model_extra.get("prompt_token_ids", prompt)
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            generated += choice.model_extra.get("token_ids") or []
            if choice.logprobs is not None:
                content += choice.logprobs.content
    return prompt, generated, content, usage


def test_logprobs_equal_transformers_first_token_included_streaming_and_not(served, reference, tokenizer):
    client, cluster = served
    question = ("A prefill engine's storage link is saturated while the decode engines' links idle. "
                "Explain in one sentence why reading the cache through the decode side helps. ") * 3
    messages = [{"role": "user", "content": question}]
    prompt, generated, content, usage = ask(client, messages, stream=False, temperature=0)
    assert usage.prompt_tokens_details.cached_tokens == 0
    check_against(reference, tokenizer, prompt, generated, content)
    # the same request streamed: the same entries, chunk by chunk
    s_prompt, s_generated, s_content, _ = ask(client, messages, stream=True, temperature=0)
    assert (s_prompt, s_generated) == (prompt, generated)
    assert [(e.token, e.logprob) for e in s_content] == [(e.token, e.logprob) for e in content]
    # the next turn loads the stored prefix through the decode engine: the same values as a forward
    wait_block_files(cluster.store.root, len(prompt) // 64)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0)
    turn2 = messages + [{"role": "assistant", "content": answer.choices[0].message.content},
                        {"role": "user", "content": "And with twice as many decode engines?"}]
    prompt2, generated2, content2, usage2 = ask(client, turn2, stream=True, temperature=0)
    assert usage2.prompt_tokens_details.cached_tokens >= 64
    assert usage2.model_extra["dualpath"]["cached_tokens_by_path"]["decode"] == usage2.prompt_tokens_details.cached_tokens
    check_against(reference, tokenizer, prompt2, generated2, content2)


def test_logprobs_at_temperature_one_are_the_raw_ones(served, reference, tokenizer):
    """Sampled at temperature 1.0 (seeded), the reported values are still the model's own
    (engine/logprobs.py: before temperature), and the same seed samples the same tokens."""
    client, _ = served
    messages = [{"role": "user", "content": "Name three storage technologies."}]
    prompt, generated, content, _ = ask(client, messages, stream=False, temperature=1.0, seed=1234)
    check_against(reference, tokenizer, prompt, generated, content)
    again = ask(client, messages, stream=True, temperature=1.0, seed=1234)
    assert again[1] == generated


def test_n_choices_from_one_prefill_the_same_for_the_same_seed(served, reference, tokenizer):
    """n = 4 at temperature 1 with a seed: four choices, the same four again for the same seed,
    each request prefilled once (the PE's counters), every choice's logprobs a forward's."""
    client, cluster = served
    pe = min(cluster.router.metrics.engine_counters)  # a local cluster numbers its PEs first

    def pe_items() -> int:
        time.sleep(1.5)  # an idle engine reports its counters every 0.5 s
        return cluster.router.metrics.engine_counters[pe].forward_items

    messages = [{"role": "user", "content": "Suggest a name for a storage-aware scheduler."}]
    body = dict(model=MODEL, messages=messages, n=4, temperature=1.0, seed=5, max_tokens=8, logprobs=True,
                top_logprobs=5, extra_body={"return_token_ids": True})
    before = pe_items()
    first = client.chat.completions.create(**body)
    again = client.chat.completions.create(**body)
    assert pe_items() - before == 2  # two requests, two prefills, for eight choices
    choices = [c.model_extra["token_ids"] for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2, 3] and len({tuple(c) for c in choices}) > 1
    assert [c.model_extra["token_ids"] for c in again.choices] == choices
    assert first.usage.completion_tokens == sum(len(c) for c in choices)
    for c, ids in zip(first.choices, choices):
        check_against(reference, tokenizer, first.model_extra["prompt_token_ids"], ids, c.logprobs.content)
