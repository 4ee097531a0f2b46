"""OpenAI's `n` on a real cluster (tiny model, real engine processes): one prefill samples every
choice's first token, the DE decodes each choice from the prompt's KV blocks, shared
(PagedKVCache.fork); each choice's tokens are those a full recompute samples with that choice's
seeds, the same for the same seed, choice 0 the n = 1 answer; the ledgers balance after."""

import asyncio
import collections

import pytest

from dualpath.config import EngineConfig, RuntimeConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from dualpath.runtime.engine.decode import decode_seed
from dualpath.runtime.model import load_model
from dualpath.runtime.model.generate import SamplerParams, TokenSampler, choice_seed

PROMPT = tuple(range(5, 205))  # 3 full blocks of 64 and 8 tokens: a partial block each choice copies
TEMPERATURE, SEED, MAX_TOKENS = 2.0, 7, 10


def reference_choice(choice: int) -> list[int]:
    """Choice `choice` by full recompute: its first token sampled as the PE does, the rest as the DE."""
    model = load_model("tiny").model
    first = TokenSampler(SamplerParams(TEMPERATURE, 1.0, choice_seed(SEED, choice)))
    rest = TokenSampler(SamplerParams(TEMPERATURE, 1.0, decode_seed(SEED, choice)))
    ids, out = list(PROMPT), []
    for i in range(MAX_TOKENS):
        token = (first if i == 0 else rest)(model.forward(ids)[-1])
        out.append(token)
        ids.append(token)
        if token in model.config.eos_token_ids:
            break
    return out


async def _ask(c: LocalCluster, n: int) -> tuple[dict[int, list[int]], dict[int, str]]:
    tokens, reasons = collections.defaultdict(list), {}
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=TEMPERATURE, seed=SEED, n=n)
    async for ev in c.router.generate(GenerationRequest(f"n{n}", PROMPT, params)):
        assert ev.index == len(tokens[ev.choice]) and ev.choice not in reasons  # each choice in order, then done
        tokens[ev.choice].append(ev.token_id)
        if ev.finished:
            reasons[ev.choice] = ev.finish_reason
    return dict(tokens), reasons


async def _run() -> tuple[list, dict]:
    cfg = RuntimeConfig(model="tiny", engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20,
                                                           de_kv_tokens=4096))
    async with LocalCluster(cfg, start_timeout_s=180) as c:
        answers = [await _ask(c, 4), await _ask(c, 1), await _ask(c, 4)]
        for _ in range(200):  # both engines let the last one go (DecodeDone after its stream ended)
            if not c.router.requests:
                break
            await asyncio.sleep(0.05)
        assert not c.router.requests
        c.router.check_invariants()
    pe = min(c.router.metrics.engine_counters)  # a local cluster numbers its PEs first
    return answers, c.router.metrics.engine_counters[pe]


@pytest.fixture(scope="module")
def run():
    return asyncio.run(_run())


def test_n_choices_are_the_recomputed_ones_choice_0_the_n1_answer_and_reproducible(run):
    (four, reasons), (one, _), (again, _) = run[0]
    assert sorted(four) == [0, 1, 2, 3] and set(reasons) == {0, 1, 2, 3}
    for choice, tokens in four.items():
        assert tokens == reference_choice(choice), choice
    assert len({tuple(t) for t in four.values()}) == 4  # at temperature 2 the choices differ
    assert one == {0: four[0]} and again == four


def test_one_prefill_per_request_whatever_n(run):
    _, pe_counters = run
    assert pe_counters.forward_items == 3  # three requests, each prefilled once (two of them n = 4)
