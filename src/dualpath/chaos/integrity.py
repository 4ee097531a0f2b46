"""`dualpath chaos --corruptions N`: damaged KV bytes, in flight and on disk, never reach an output.

1. Reference: a fault-free 1P1D cluster serves `CONVERSATIONS` greedy conversations of `TURNS`
   turns, all conversations at once, turn by turn; each turn's prompt is the conversation so far
   plus new tokens, so every turn after the first reads its context's blocks from the store.
2. Rounds, each on a fresh cluster and store, until `target` corruptions were injected:
   - in flight: RuntimeConfig.faults.kv_corrupt_probability flips one bit in that share of the block
     pieces the engines send on the layer streams and PD transfers (transport/integrity.py);
   - on disk: between turns, once the turn's blocks are persisted, one byte of one stored block
     file (header or payload, seeded) of each even-numbered conversation is XORed; the odd ones
     keep their whole hit, so their turns stream long layer loads.
   The rounds cycle the read side (PE, DE, the policy's choice), so both layer-stream sources are
   hit. Every turn's prompt is the reference's, so each output is compared on its own.
3. A wrong output is a turn whose tokens differ from the reference's. Detections: the engines'
   integrity counters (router/metrics.py) and the blocks the store quarantined (a corrupt file
   is renamed into root/quarantine/ when a read fails its CRC32 or header check).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from ..config import EngineConfig, FaultConfig, RuntimeConfig, StoreConfig
from ..core.blocks import chain_digests
from ..runtime.api import GenerationRequest, SamplingParams
from ..runtime.cluster import LocalCluster
from ..runtime.store.files import QUARANTINE_DIR, block_path
from ..runtime.router.router import Router

CONVERSATIONS = 16
TURNS = 6
FIRST_TOKENS = 130  # two Full Blocks and a part
APPEND_TOKENS = 70  # new tokens per later turn
GEN_TOKENS = 16
SIDES = ("prefill", "decode", None)  # None: the scheduler's choice
PERSIST_DEADLINE_S = 30.0  # a turn's blocks reach the store in milliseconds on an idle machine
COUNTER_SETTLE_S = 1.2  # engines report counters every 0.5 s (EngineBase.maybe_report_counters)


@dataclass(frozen=True, slots=True)
class RoundResult:
    side: str
    requests: int
    wrong_outputs: int
    flips_in_flight: int
    flips_on_disk: int
    layer_checksum_failures: int
    pd_checksum_failures: int
    layer_retransmits: int
    kv_recomputes: int
    quarantined_blocks: int
    seconds: float


def _fresh_tokens(conv: int, turn: int, n: int, vocab: int) -> list[int]:
    return [(13 + 29 * conv + 11 * turn + 7 * j) % (vocab - 32) + 16 for j in range(n)]


def _config(model: str, side: str | None, probability: float, store_dir: str | None, seed: int) -> RuntimeConfig:
    return RuntimeConfig(model=model, force_read_side=side, faults=FaultConfig(kv_corrupt_probability=probability),
                         store=StoreConfig(location=store_dir),
                         engines=EngineConfig(host_buffer_bytes=64 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=32768),
                         seed=seed)


async def _generate(router: Router, name: str, prompt: list[int]) -> list[int]:
    params = SamplingParams(max_tokens=GEN_TOKENS, temperature=0.0, ignore_eos=True, min_tokens=GEN_TOKENS)
    return [ev.token_id async for ev in router.generate(GenerationRequest(name, prompt, params))]


async def _persisted(store: Any, tokens: list[int], block_tokens: int) -> list[bytes]:
    """The chain of `tokens`' full blocks, once all are in the store (or the deadline passed)."""
    digests = chain_digests(tokens, block_tokens)
    deadline = time.monotonic() + PERSIST_DEADLINE_S
    while store.lookup(digests) < len(digests) and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return digests


def flip_stored_block(root: str, digest: bytes, rng: random.Random) -> bool:
    """XOR one byte (any of header and payload) of a stored block file; False if it is not there."""
    path = block_path(root, digest)
    try:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            at = rng.randrange(size)
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ (1 << rng.randrange(8))]))
    except (FileNotFoundError, IndexError):
        return False
    return True


async def _conversations(cluster: LocalCluster, prompts: list[list[list[int]]] | None, disk_rng: random.Random | None,
                         root: str | None) -> tuple[list[list[list[int]]], list[list[list[int]]], int]:
    """Every conversation turn by turn; `prompts` None: build them from this run's own outputs
    (the reference). Returns (prompts, outputs, bytes flipped on disk)."""
    router, bt = cluster.router, cluster.cfg.block_tokens
    vocab = router.tokenizer.vocab_size
    built: list[list[list[int]]] = [[] for _ in range(CONVERSATIONS)]
    outs: list[list[list[int]]] = [[] for _ in range(CONVERSATIONS)]
    flips = 0
    for t in range(TURNS):
        for c in range(CONVERSATIONS):
            if prompts is not None:
                built[c].append(prompts[c][t])
            else:
                context = built[c][-1] + outs[c][-1] if t else []
                built[c].append(context + _fresh_tokens(c, t, APPEND_TOKENS if t else FIRST_TOKENS, vocab))
        got = await asyncio.gather(*(_generate(router, f"c{c}t{t}", built[c][t]) for c in range(CONVERSATIONS)))
        for c, out in enumerate(got):
            outs[c].append(out)
        if disk_rng is not None and root is not None and t + 1 < TURNS:
            for c in range(0, CONVERSATIONS, 2):
                chain = await _persisted(router.store, (built[c][t] + outs[c][t])[:-1], bt)
                flips += bool(chain) and flip_stored_block(root, disk_rng.choice(chain), disk_rng)
    return built, outs, flips


async def _round(model: str, index: int, probability: float, prompts: list, reference: list, seed: int) -> RoundResult:
    side = SIDES[index % len(SIDES)]
    root = tempfile.mkdtemp(prefix="dp-integrity-")
    t0 = time.monotonic()
    try:
        # the same seed every round: it also names the tiny model's weights. The rounds differ in their
        # disk flips, which change every later transfer and so the in-flight draws too
        cfg = _config(model, side, probability, root, seed)
        async with LocalCluster(cfg, start_timeout_s=180) as cluster:
            _, outs, disk = await _conversations(cluster, prompts, random.Random(f"disk:{seed}:{index}"), root)
            await asyncio.sleep(COUNTER_SETTLE_S)
            got = cluster.router.metrics.integrity()
        qdir = os.path.join(root, QUARANTINE_DIR)
        quarantined = len(os.listdir(qdir)) if os.path.isdir(qdir) else 0
    finally:
        shutil.rmtree(root, ignore_errors=True)
    wrong = sum(o != r for oc, rc in zip(outs, reference) for o, r in zip(oc, rc))
    return RoundResult(side or "policy", CONVERSATIONS * TURNS, wrong, got["kv_flips_injected"], disk,
                       got["layer_checksum_failures"], got["pd_checksum_failures"], got["layer_retransmits"],
                       got["kv_recomputes"], quarantined, time.monotonic() - t0)


async def run_corruptions(target: int, model: str = "tiny", probability: float = 0.05, seed: int = 0,
                          max_rounds: int = 50, on_round: Callable[[RoundResult], None] | None = None) -> dict:
    """Rounds until `target` corruptions were injected (in flight + on disk), against one reference."""
    async with LocalCluster(_config(model, None, 0.0, None, seed), start_timeout_s=180) as cluster:
        prompts, reference, _ = await _conversations(cluster, None, None, None)
    rounds: list[RoundResult] = []
    while sum(r.flips_in_flight + r.flips_on_disk for r in rounds) < target and len(rounds) < max_rounds:
        res = await _round(model, len(rounds), probability, prompts, reference, seed)
        rounds.append(res)
        if on_round is not None:
            on_round(res)
    total = {k: sum(getattr(r, k) for r in rounds) for k in RoundResult.__slots__ if k not in ("side", "seconds")}
    total["injected"] = total["flips_in_flight"] + total["flips_on_disk"]
    return {"config": {"model": model, "probability_per_piece": probability, "conversations": CONVERSATIONS,
                       "turns": TURNS, "gen_tokens": GEN_TOKENS, "pd": "1P1D", "target": target, "seed": seed},
            "rounds": [asdict(r) for r in rounds], "total": total}
