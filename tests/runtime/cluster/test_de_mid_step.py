"""A decode engine serves DE-path layer pulls between the layers of its decode step
(runtime/engine/mid_step.py), and the tokens stay those of recomputing from scratch.

One request keeps the decode engine stepping while a conversation reads every hit on the DE path;
its pulls then arrive during steps. With `de_serves_mid_step` the engine serves some of them there;
without it, none (they wait for the step's end). Both give the reference tokens."""

import asyncio

import pytest

from dualpath.config import EngineConfig, RuntimeConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from persist_wait import wait_chain_stored
from test_kv_paths import reference_conversation

TURNS = [list(range(5, 205)), list(range(20, 60)), list(range(100, 170))]
GEN = 8
BUSY_PROMPT = tuple(range(30, 60))
BUSY_MAX_TOKENS = 4000  # ignores EOS: steps until cancelled, far past the conversation's end


async def _busy(c: LocalCluster, started: asyncio.Event) -> int:
    n = 0
    req = GenerationRequest("busy", BUSY_PROMPT, SamplingParams(max_tokens=BUSY_MAX_TOKENS, temperature=0, ignore_eos=True))
    async for _ in c.router.generate(req):
        n += 1
        if n == 5:
            started.set()
    return n


async def _conversation_beside_a_busy_decode(cfg: RuntimeConfig) -> tuple[list[list[int]], list[int], int, int]:
    async with LocalCluster(cfg, start_timeout_s=180) as c:
        started = asyncio.Event()
        busy = asyncio.create_task(_busy(c, started))
        await asyncio.wait_for(started.wait(), 120)
        context: list[int] = []
        outs, cached = [], []
        for i, append in enumerate(TURNS):
            prompt = tuple(context + append)
            out, hit = [], 0
            async for ev in c.router.generate(GenerationRequest(f"t{i}", prompt, SamplingParams(max_tokens=GEN, temperature=0))):
                out.append(ev.token_id)
                hit = ev.cached_tokens
            outs.append(out)
            cached.append(hit)
            context = list(prompt) + out
            await wait_chain_stored(c.router.store, context[:-1], cfg.block_tokens)
        still_busy = not busy.done()
        busy.cancel()
        with pytest.raises(asyncio.CancelledError):
            await busy
        await asyncio.sleep(0.2)  # the cancel reaches the DE
        c.router.check_invariants()
    counters = c.router.metrics.engine_counters.values()
    return outs, cached, int(still_busy), sum(x.served_mid_step for x in counters)


@pytest.mark.parametrize("mid_step", [True, False])
def test_pulls_served_between_layers_give_the_reference_tokens(mid_step):
    cfg = RuntimeConfig(model="tiny", mode="dualpath", force_read_side="decode",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=8192, de_serves_mid_step=mid_step))
    outs, cached, still_busy, served = asyncio.run(_conversation_beside_a_busy_decode(cfg))
    assert outs == reference_conversation("tiny", TURNS, GEN)
    assert cached[0] == 0 and all(h > 0 for h in cached[1:])  # later turns loaded a hit on the DE path
    assert still_busy  # the decode engine was stepping through every turn
    if mid_step:
        assert served > 0
    else:
        assert served == 0
