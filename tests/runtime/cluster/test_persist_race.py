"""A turn sent the moment the previous one finished hits every full block of its earlier context,
even while the decode engine is still writing the last of them (the router waits for a block it
was told is being persisted instead of recomputing it), on a machine loaded by two CPU hogs."""

import asyncio
import subprocess

import pytest

from dualpath.config import EngineConfig, LinkConfig, RuntimeConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster

TURNS = [list(range(5, 205)), list(range(20, 60)), list(range(100, 170)), list(range(1, 90)), list(range(7, 71))]
GEN = 12


async def conversation_without_waits(cfg: RuntimeConfig) -> tuple[list[int], list[int], int]:
    async with LocalCluster(cfg, start_timeout_s=180) as c:
        context: list[int] = []
        cached, lengths = [], []
        for i, append in enumerate(TURNS):
            prompt = tuple(context + append)
            params = SamplingParams(max_tokens=GEN, min_tokens=GEN, ignore_eos=True, temperature=0)
            out, hit = [], 0
            async for ev in c.router.generate(GenerationRequest(f"t{i}", prompt, params)):
                out.append(ev.token_id)
                hit = ev.cached_tokens
            cached.append(hit)
            lengths.append(len(prompt))
            context = list(prompt) + out  # no wait: the next turn goes out at once
        c.router.check_invariants()
        deadline = asyncio.get_running_loop().time() + 30.0
        while c.router.placement.persisting and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)  # the last turn's writes are still landing
        left = sum(c.router.placement.persisting.values())
    return cached, lengths, left


@pytest.fixture
def two_cpu_hogs():
    hogs = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


@pytest.mark.parametrize("mode,side", [("dualpath", "decode"), ("basic", None)])
def test_next_turn_with_no_wait_hits_its_whole_earlier_context(two_cpu_hogs, mode, side):
    # a slow SNIC write (a 64 KB block of the tiny model takes ~30 ms) widens the window in
    # which the next turn's lookup arrives before the write has landed
    cfg = RuntimeConfig(model="tiny", mode=mode, force_read_side=side,
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        links=LinkConfig(snic_bytes_per_s=2e6, cnic_bytes_per_s=16e6))
    cached, lengths, left = asyncio.run(conversation_without_waits(cfg))
    assert cached[0] == 0
    for i in range(1, len(TURNS)):
        computed = lengths[i - 1] + GEN - 1  # the previous context; its last token's KV is never computed
        assert cached[i] == computed // 64 * 64, f"turn {i}: hit {cached[i]} of {computed // 64 * 64} tokens"
    assert left == 0  # every announced write reported back (none counted twice or lost)
