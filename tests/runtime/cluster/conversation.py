"""One agent's conversation on a local cluster, one turn at a time (test_kv_paths.TURNS), with what
the tests of the read paths check: each turn's tokens, the scheduler's decisions, and the storage
bytes each turn read on each side."""

from dataclasses import dataclass

from dualpath.config import RuntimeConfig
from dualpath.metrics.decisions import DecisionLog
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from persist_wait import wait_chain_stored
from test_kv_paths import TURNS


@dataclass
class Conversation:
    outs: list  # per turn its tokens (with n > 1 choices: per choice)
    decisions: list  # metrics/decisions.py, one per turn
    reads: list[dict]  # per turn the storage bytes read on each side ("prefill", "decode")
    full_block_bytes: int
    kv_bytes_per_token: int


async def run_conversation(cfg: RuntimeConfig, params: SamplingParams, turns: list[list[int]] = TURNS) -> Conversation:
    """Each turn after the last one's blocks are stored, so that every later turn hits them all."""
    async with LocalCluster(cfg, start_timeout_s=180) as c:
        router = c.router
        router.metrics.decisions = DecisionLog(router.clock.now_s())
        context: list[int] = []
        outs, reads = [], []
        for i, append in enumerate(turns):
            prompt = tuple(context + append)
            before = list(router.metrics.bytes_by_side)
            events = [ev async for ev in router.generate(GenerationRequest(f"t{i}", prompt, params))]
            out = [ev.token_id for ev in events if ev.choice == 0]  # the context goes on with choice 0
            outs.append([[ev.token_id for ev in events if ev.choice == k] for k in range(params.n)] if params.n > 1 else out)
            after = router.metrics.bytes_by_side
            reads.append({"prefill": after[0] - before[0], "decode": after[1] - before[1]})
            context = list(prompt) + out
            await wait_chain_stored(router.store, context[:-1], cfg.block_tokens)
        router.check_invariants()
        return Conversation(outs, list(router.metrics.decisions.decisions), reads, router.full_block_bytes,
                            router.kv_bytes_per_token)
