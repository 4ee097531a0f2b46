"""`+selective` on the runtime: a short append is prefilled by its decode engine (no PE, no
transfer; runtime/engine/local_prefill.py), and every turn's tokens are the ones recomputing from
scratch gives, and the ones basic gives when sampling (the same seeds whichever engine
prefilled). A local turn's hit is read on the DE's node, or by a PE node that relays it (tiny
model, real engine processes)."""

import asyncio
from dataclasses import replace

import pytest

from dualpath.config import EngineConfig, LinkConfig, RuntimeConfig, SchedulerConfig
from dualpath.metrics.decisions import DecisionLog
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from persist_wait import wait_chain_stored
from conversation import run_conversation
from test_kv_paths import GEN, TURNS, reference_conversation

# turns 1-3 of TURNS have 60, 78 and 115 uncached tokens (their hits: 3, 4 and 5 blocks); turn 0's
# 200 go to the PE
THRESHOLD_TOKENS = 128


def _config(mode: str) -> RuntimeConfig:
    return RuntimeConfig(model="tiny", mode=mode, scheduler=SchedulerConfig(local_prefill_max_tokens=THRESHOLD_TOKENS),
                         engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096))


@pytest.mark.parametrize("mode", ["selective", "dualpath+selective"])
def test_short_appends_are_prefilled_on_the_de_and_give_the_recomputed_tokens(mode):
    conv = asyncio.run(run_conversation(_config(mode), SamplingParams(max_tokens=GEN, temperature=0)))
    outs, decisions, reads, fbb = conv.outs, conv.decisions, conv.reads, conv.full_block_bytes
    assert outs == reference_conversation("tiny")
    assert [d.request for d in decisions] == [f"t{i}" for i in range(len(TURNS))]
    assert decisions[0].pe >= 0 and all(d.pe == -1 for d in decisions[1:])  # -1: no PE
    for d, got in zip(decisions[1:], reads[1:]):
        assert d.side == "decode" and d.hit_tokens > 0
        assert got == {"prefill": 0, "decode": d.hit_tokens // 64 * fbb}, (d, got)


def test_sampled_tokens_do_not_depend_on_which_engine_prefilled():
    """Temperature 0.8, a fixed seed, two choices: the DE's first tokens are the PE's (the same rule
    and seeds), and so is everything after them, choice by choice."""
    params = SamplingParams(max_tokens=GEN, temperature=0.8, seed=7, n=2)
    conv = asyncio.run(run_conversation(_config("selective"), params))
    local, decisions = conv.outs, conv.decisions
    basic = asyncio.run(run_conversation(_config("basic"), params)).outs
    assert [d.pe == -1 for d in decisions] == [False, True, True, True]
    assert local == basic and all(len(c) == GEN for turn in local for c in turn)
    assert any(a != b for a, b in local[1:])  # two choices that differ: the seeds are per choice


def test_a_pe_node_relays_a_local_hit_when_its_read_queue_is_shorter():
    """Two agents at once on slow SNICs (2 MB/s): when one local turn's hit is still queued on the DE
    node, the other's is read by the PE node and relayed into the DE's region (engine/relay.py);
    every turn's tokens are still the recomputed ones, and each hit is read once, on its side."""
    cfg = replace(_config("dualpath+selective"), links=LinkConfig(snic_bytes_per_s=2e6, cnic_bytes_per_s=16e6))
    turns_b = [[t + 7 for t in turn] for turn in TURNS]

    async def both() -> tuple[list, list, list, int]:
        async with LocalCluster(cfg, start_timeout_s=180) as c:
            router = c.router
            router.metrics.decisions = DecisionLog(router.clock.now_s())
            contexts: list[list[int]] = [[], []]
            outs: list[list] = [[], []]
            for i in range(len(TURNS)):
                async def turn(a: int, append: list[int]) -> None:
                    prompt = tuple(contexts[a] + append)
                    params = SamplingParams(max_tokens=GEN, temperature=0)
                    out = [ev.token_id async for ev in router.generate(GenerationRequest(f"a{a}t{i}", prompt, params))]
                    outs[a].append(out)
                    contexts[a] = list(prompt) + out
                await asyncio.gather(turn(0, TURNS[i]), turn(1, turns_b[i]))
                for a in (0, 1):
                    await wait_chain_stored(router.store, contexts[a][:-1], cfg.block_tokens)
            router.check_invariants()
            return outs, list(router.metrics.decisions.decisions), list(router.metrics.bytes_by_side), router.full_block_bytes

    outs, decisions, by_side, fbb = asyncio.run(both())
    assert outs[0] == reference_conversation("tiny") and outs[1] == reference_conversation("tiny", turns_b)
    local = [d for d in decisions if d.pe == -1]
    relayed = [d for d in local if d.side == "prefill"]
    assert len(local) == 6 and 1 <= len(relayed) < 6, [(d.request, d.side) for d in local]
    assert by_side[0] == sum(d.hit_tokens // 64 for d in relayed) * fbb  # the PE node read exactly the relayed hits
    assert by_side[1] == sum(d.hit_tokens // 64 for d in local if d.side == "decode") * fbb
