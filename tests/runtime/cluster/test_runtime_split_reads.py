"""`dualpath+split` on the runtime: a hit read on both nodes at once (the PE node its prefix, the DE
node the rest, streamed to the PE layer by layer) gives the tokens recomputing from scratch gives,
each node's SNIC reads exactly the part the rule (core/policy/split.py) decided, and a damaged load
is caught and recomputed as on the single-side paths (tiny model, real engine processes)."""

import asyncio
from dataclasses import replace

from dualpath.config import EngineConfig, FaultConfig, RuntimeConfig, SchedulerConfig
from dualpath.core.policy import choose_read_side, split_read
from dualpath.runtime.api import SamplingParams
from dualpath.runtime.router.state import split_rule
from dualpath.runtime.transport.integrity import LAYER_RETRANSMITS_MAX
from conversation import run_conversation
from test_kv_integrity import corrupted_conversation, recompute_reference
from test_kv_paths import GEN, TURNS, reference_conversation

# a split needs at least this many hit blocks; 2 (the least allowed) splits every later turn's
# 3-5 block hit of TURNS (the default, MIN_SPLIT_BLOCKS, would leave them whole)
SPLIT_MIN_BLOCKS = 2


def _config(**kw) -> RuntimeConfig:
    return RuntimeConfig(model="tiny", mode="dualpath+split", scheduler=SchedulerConfig(split_min_blocks=SPLIT_MIN_BLOCKS),
                         engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                         **kw)


async def _split_conversation(cfg: RuntimeConfig) -> tuple[list[list[int]], list[dict], list, int, int]:
    """(tokens per turn, per turn the storage bytes read on each side, the decisions, Full Block bytes,
    KV bytes per token): one turn at a time, so each turn's reads are its own."""
    c = await run_conversation(cfg, SamplingParams(max_tokens=GEN, temperature=0))
    return c.outs, c.reads, c.decisions, c.full_block_bytes, c.kv_bytes_per_token


def test_split_reads_give_the_recomputed_tokens_and_read_each_part_on_its_node():
    cfg = _config()
    outs, reads, decisions, fbb, kvb = asyncio.run(_split_conversation(cfg))
    assert outs == reference_conversation("tiny")
    rule = split_rule(cfg, kvb)
    assert [d.request for d in decisions] == [f"t{i}" for i in range(len(TURNS))]
    assert decisions[0].hit_tokens == 0 and reads[0] == {"prefill": 0, "decode": 0}
    for d, got in zip(decisions[1:], reads[1:]):
        # one request at a time: both read queues are empty when the pass decides
        want = split_read(rule, d.hit_tokens, 0, 0, choose_read_side(0, 0))
        assert 0 < d.pe_part_tokens == want < d.hit_tokens, d
        assert d.side == "decode"  # a split's side: the DE's, with a PE part
        assert got == {"prefill": d.pe_part_tokens // cfg.block_tokens * fbb,
                       "decode": (d.hit_tokens - d.pe_part_tokens) // cfg.block_tokens * fbb}, (d, got)


def test_below_split_min_blocks_a_hit_is_read_on_one_side():
    """The same workload with the default minimum (8 blocks): no turn's hit is split."""
    cfg = replace(_config(), scheduler=SchedulerConfig())
    outs, reads, decisions, _, _ = asyncio.run(_split_conversation(cfg))
    assert outs == reference_conversation("tiny")
    assert all(d.pe_part_tokens == 0 for d in decisions)
    assert all(0 in r.values() for r in reads)  # each turn read on one node only


def test_split_reads_every_piece_flipped_exhaust_retries_and_recompute():
    """As the DE path's test (test_kv_integrity.py): turn 2's 3 hit blocks split 2 (PE) + 1 (DE);
    every piece of both parts' layer loads is flipped, so layer 0 fails 1 + LAYER_RETRANSMITS_MAX
    times, 3 pieces a time, layer 1 once; the PE recomputes the prompt, the DE both turns' prompts."""
    cfg = _config(faults=FaultConfig(kv_corrupt_probability=1.0))
    outs, got = asyncio.run(corrupted_conversation(cfg))
    assert outs == recompute_reference()
    assert got["layer_retransmits"] == LAYER_RETRANSMITS_MAX
    assert got["layer_checksum_failures"] == 3 * (1 + LAYER_RETRANSMITS_MAX) + 3
    assert got["pd_checksum_failures"] == 4 * 4 + 5 * 4
    assert got["kv_recomputes"] == 1 + 2
