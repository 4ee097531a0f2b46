"""Read or recompute on the real cluster (core/policy/recompute.py): a store that answers late is measured by
the engines' readers, and the scheduler then computes a hit again instead of waiting for it; the
tokens stay those of a full recompute (tiny model, real engine processes)."""

import asyncio
import time

from dualpath.config import EngineConfig, FaultConfig, RuntimeConfig, SchedulerConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from persist_wait import wait_chain_stored
from test_kv_paths import GEN, TURNS, reference_conversation

DELAY_S = 1.0  # the injected store latency: far above what recomputing a tiny-model hit takes


async def conversation(cfg: RuntimeConfig) -> tuple[list[list[int]], list[int], list[float], dict]:
    async with LocalCluster(cfg, start_timeout_s=180) as c:
        context: list[int] = []
        outs, cached, ttft = [], [], []
        for i, append in enumerate(TURNS):
            prompt = tuple(context + append)
            out, hit, t0, first = [], 0, time.monotonic(), None
            async for ev in c.router.generate(GenerationRequest(f"t{i}", prompt, SamplingParams(max_tokens=GEN, temperature=0))):
                first = first or time.monotonic() - t0
                out.append(ev.token_id)
                hit = ev.cached_tokens
            outs.append(out)
            cached.append(hit)
            ttft.append(first)
            context = list(prompt) + out
            await wait_chain_stored(c.router.store, context[:-1], cfg.block_tokens)
            if i == 1:  # the first read has been timed: wait for the PE's report of it
                deadline = time.monotonic() + 10.0
                while c.router.metrics.store_latency_s(0) < DELAY_S / 2 and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
        c.router.check_invariants()
        summary = c.router.metrics.summary()
    return outs, cached, ttft, summary


def test_a_slow_store_is_measured_and_its_hits_recomputed_with_the_same_tokens():
    cfg = RuntimeConfig(model="tiny", mode="dualpath", force_read_side="prefill",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        faults=FaultConfig(store_read_delay_s=DELAY_S),
                        scheduler=SchedulerConfig(recompute_when_faster=True))
    outs, cached, ttft, summary = asyncio.run(conversation(cfg))
    assert outs == reference_conversation("tiny")  # recomputed or read, the same tokens as from scratch
    assert cached[0] == 0 and cached[1] > 0  # turn 1 read its hit: the store's latency was not known yet
    assert ttft[1] >= DELAY_S  # ... and waited for it
    assert cached[2] == cached[3] == 0 and summary["recomputed_hits"] == 2  # then the rule recomputes
    assert max(ttft[2:]) < DELAY_S  # without the wait
