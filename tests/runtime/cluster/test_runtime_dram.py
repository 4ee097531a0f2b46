"""`+dram` on the runtime: each engine node keeps the Full Blocks it read or persisted in a DRAM tier
(runtime/store/dram_tier.py) and reads only the rest from storage; the read-side rule sees what
each side's tier holds (the router's model, runtime/router/dram_index.py). Every turn's tokens are
the ones recomputing from scratch gives (tiny model, real engine processes)."""

import asyncio

import pytest

from dualpath.config import EngineConfig, RuntimeConfig
from conversation import run_conversation
from dualpath.runtime.api import SamplingParams
from test_kv_paths import GEN, TURNS, reference_conversation


def _config(mode: str) -> RuntimeConfig:
    return RuntimeConfig(model="tiny", mode=mode,
                         engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096))


def test_dualpath_reads_every_later_hit_from_the_de_nodes_dram():
    """The DE persisted every block the next turn hits, so its node's tier holds the whole hit: the
    rule picks the DE side (a side holding all of it costs nothing) and no byte crosses a SNIC."""
    conv = asyncio.run(run_conversation(_config("dualpath+dram"), SamplingParams(max_tokens=GEN, temperature=0)))
    assert conv.outs == reference_conversation("tiny")
    assert all(d.hit_tokens > 0 and d.side == "decode" for d in conv.decisions[1:]), conv.decisions
    assert conv.reads[1:] == [{"prefill": 0, "decode": 0}] * (len(TURNS) - 1)


def test_basic_reads_from_storage_only_the_blocks_its_pe_node_has_not_read_before():
    """basic+dram reads on the PE side: turn 1 reads its whole hit (3 blocks) from storage, and each
    later turn only the one block its PE node never read (the block the last turn's DE persisted)."""
    conv = asyncio.run(run_conversation(_config("basic+dram"), SamplingParams(max_tokens=GEN, temperature=0)))
    assert conv.outs == reference_conversation("tiny")
    fbb = conv.full_block_bytes
    hits = [d.hit_tokens // 64 for d in conv.decisions]
    assert hits == [0, 3, 4, 5] and all(d.side == "prefill" for d in conv.decisions)
    assert conv.reads == [{"prefill": 0, "decode": 0}, {"prefill": 3 * fbb, "decode": 0},
                          {"prefill": fbb, "decode": 0}, {"prefill": fbb, "decode": 0}]


@pytest.mark.parametrize("mode", ["basic", "dualpath"])
def test_without_the_tier_every_hit_is_read_from_storage(mode):
    """The same conversation without `+dram`: every turn reads its whole hit (the tests above fail
    for a tier that serves nothing, and this one for a tier that leaks into modes without it)."""
    conv = asyncio.run(run_conversation(_config(mode), SamplingParams(max_tokens=GEN, temperature=0)))
    fbb = conv.full_block_bytes
    assert [sum(r.values()) for r in conv.reads] == [d.hit_tokens // 64 * fbb for d in conv.decisions]
    assert [d.hit_tokens // 64 for d in conv.decisions] == [0, 3, 4, 5]
