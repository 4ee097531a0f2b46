"""At shutdown every engine's writer drains its queued persists before its last report, and the
cluster waits for that report: the ledger's SNIC write bytes are exactly the blocks the store holds,
whether the engines are this cluster's processes or joined it over the network (as on other hosts,
where nothing here can join their process). The SNIC's write rate is slow enough that a long
prompt's persists are still queued when its answer is done."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dualpath.config import EngineConfig, LinkConfig, RuntimeConfig, StoreConfig, TransportConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from dualpath.runtime.store.format import HEADER_BYTES

PROMPT_TOKENS = 1200  # 18 Full Blocks of 64 tokens: about 1.2 s of persists at the SNIC below
SNIC_BYTES_PER_S = 1e6  # a tiny-model Full Block (64 KB) every ~65 ms


def _engine(router: str, role: str, token_file: Path) -> subprocess.Popen:
    args = [sys.executable, "-m", "dualpath.cli", "engine", "--router", router, "--role", role,
            "--token-file", str(token_file)]
    return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


async def _one_long_prompt(cfg: RuntimeConfig, **cluster_kw) -> dict[int, int]:
    """Each engine's SNIC write bytes in the ledger after the cluster stopped right after the answer."""
    async with LocalCluster(cfg, start_timeout_s=180, **cluster_kw) as c:
        params = SamplingParams(max_tokens=4, min_tokens=4, ignore_eos=True, temperature=0)
        prompt = tuple(5 + i % 290 for i in range(PROMPT_TOKENS))  # tiny: 300 ids
        async for _ in c.router.generate(GenerationRequest("long", prompt, params)):
            pass
        queued = sum(c.router.placement.persisting.values())
    assert queued > 0, "every persist landed before the stop: the SNIC is too fast for this test"
    return {e: x.storage_write_bytes for e, x in c.router.metrics.engine_counters.items()}


def _stored(root: Path) -> tuple[int, int]:
    """What the store holds: its blocks, and their bytes less each file's header (store/files.py
    names them <hex>.kvb)."""
    files = list(root.glob("*/*.kvb"))
    return len(files), sum(f.stat().st_size - HEADER_BYTES for f in files)


@pytest.mark.parametrize("joined", [False, True], ids=["processes", "joined-over-tcp"])
def test_the_ledger_holds_every_persist_that_drained_at_shutdown(tmp_path, joined):
    root = tmp_path / "store"
    root.mkdir()
    token = tmp_path / "token"
    token.write_text("the cluster's secret\n")
    cfg = RuntimeConfig(model="tiny", mode="basic", store=StoreConfig(location=str(root)),
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        links=LinkConfig(snic_bytes_per_s=SNIC_BYTES_PER_S, cnic_bytes_per_s=16 * SNIC_BYTES_PER_S),
                        transport=TransportConfig(kind="tcp", peer_token_file=str(token)) if joined else TransportConfig())
    engines: list[subprocess.Popen] = []
    kw = {}
    if joined:
        kw = {"engines_listen": "tcp://127.0.0.1:0",
              "on_router_ready": lambda router: engines.extend(_engine(router, r, token) for r in ("prefill", "decode"))}
    try:
        ledger = asyncio.run(_one_long_prompt(cfg, **kw))
        for p in engines:
            assert p.wait(60) == 0, p.stderr.read()[-2000:]
    finally:
        for p in engines:
            if p.poll() is None:
                p.kill()
    blocks, stored = _stored(root)
    assert blocks >= PROMPT_TOKENS // 64  # at least the prompt's Full Blocks landed
    assert sum(ledger.values()) == stored, (ledger, blocks, stored)
