"""The same request gives the same tokens whichever path loaded its KV (PE path, DE path, basic,
oracle) and the same as recomputing from scratch, over a multi-turn conversation (tiny model,
real engine processes, a real store)."""

import asyncio
import os

import pytest
import torch

from dualpath.config import EngineConfig, RuntimeConfig, TransportConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from dualpath.runtime.model import load_model
from dualpath.runtime.transport.mooncake import MooncakeAddress, mooncake_loads
from persist_wait import wait_chain_stored

# The engines' device; the reference always recomputes on the CPU. tools/gpu_check.sh sets `cuda`.
DEVICE = os.environ.get("DUALPATH_TEST_DEVICE", "cpu")
TURNS = [list(range(5, 205)), list(range(20, 60)), list(range(100, 170)), list(range(1, 90))]
GEN = 12


def reference_conversation(model_name: str, turns: list[list[int]] = TURNS, gen: int = GEN,
                           logprobs: list | None = None) -> list[list[int]]:
    """Greedy tokens by full recompute (no cache at all), turn by turn; `logprobs` gets each
    token's log-probability."""
    m = load_model(model_name).model
    context: list[int] = []
    outs = []
    for append in turns:
        ids = context + append
        out = []
        for _ in range(gen):
            logits = m.forward(ids)[-1]
            t = int(logits.argmax())
            out.append(t)
            if logprobs is not None:
                logprobs.append(torch.log_softmax(logits.float(), dim=-1)[t].item())
            ids = ids + [t]
            if t in m.config.eos_token_ids:
                break
        outs.append(out)
        context = context + append + out
    return outs


async def cluster_conversation(cfg: RuntimeConfig, endpoints: list | None = None, logprobs: list | None = None,
                               data_endpoints: list | None = None, **cluster_kw) -> tuple[list[list[int]], list[int], dict]:
    """(tokens per turn, cached tokens per turn, the router's summary); `logprobs` gets each
    token's log-probability as the cluster reported it; `data_endpoints` where peers write to each engine."""
    async with LocalCluster(cfg, start_timeout_s=180, **cluster_kw) as c:
        if endpoints is not None:
            endpoints.extend([c.router.endpoint, *(e.endpoint for e in c.router.engines.values())])
        if data_endpoints is not None:
            data_endpoints.extend(e.data_endpoint for e in c.router.engines.values())
        context: list[int] = []
        outs, cached = [], []
        for i, append in enumerate(TURNS):
            prompt = tuple(context + append)
            out, hit = [], 0
            params = SamplingParams(max_tokens=GEN, temperature=0, logprobs=0)
            async for ev in c.router.generate(GenerationRequest(f"t{i}", prompt, params)):
                out.append(ev.token_id)
                hit = ev.cached_tokens
                if logprobs is not None:
                    logprobs.append(ev.logprobs.logprob)
            outs.append(out)
            cached.append(hit)
            context = list(prompt) + out
            # the DE persists the turn's full blocks (the last token's KV is not computed yet)
            await wait_chain_stored(c.router.store, context[:-1], cfg.block_tokens)
        c.router.check_invariants()
    summary = c.router.metrics.summary()  # after the engines' last Counters (sent as they stop)
    return outs, cached, summary


@pytest.fixture(scope="module")
def reference_logprobs():
    logprobs: list[float] = []
    return reference_conversation("tiny", logprobs=logprobs), logprobs


@pytest.fixture(scope="module")
def reference(reference_logprobs):
    return reference_logprobs[0]


@pytest.mark.parametrize("mode,side", [("dualpath", "prefill"), ("dualpath", "decode"), ("basic", None), ("oracle", None)])
def test_tokens_identical_on_every_path_and_to_recompute(reference_logprobs, mode, side):
    """... and so are their logprobs (the first token's from the PE, the rest from the DE)."""
    reference, reference_lp = reference_logprobs
    cfg = RuntimeConfig(model="tiny", mode=mode, force_read_side=side,
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        device=DEVICE)
    logprobs: list[float] = []
    outs, cached, summary = asyncio.run(cluster_conversation(cfg, logprobs=logprobs))
    assert outs == reference
    assert len(logprobs) == len(reference_lp) and max(abs(a - b) for a, b in zip(logprobs, reference_lp)) <= 1e-4
    # turn 0 has nothing stored; later turns hit every full block of the previous context
    assert cached[0] == 0
    context = 0
    for i in range(1, len(TURNS)):
        context += len(TURNS[i - 1]) + len(reference[i - 1])
        assert cached[i] == context // 64 * 64
    read = summary["bytes"]
    assert read["remote_writes"] == 0  # one host: every KV byte between engines went through shared memory
    if side == "decode":
        assert read["storage_via_decode"] > 0 and read["storage_to_prefill"] == 0
    elif mode != "oracle":
        assert read["storage_to_prefill"] > 0 and read["storage_via_decode"] == 0


_NEEDS_MOONCAKE = pytest.mark.skipif(not mooncake_loads(), reason="Mooncake Transfer Engine does not load: pip install "
                                     "'dualpath[mooncake]' and apt-get install libibverbs1 librdmacm1 libnuma1")


@pytest.mark.parametrize("side,transfer", [
    ("decode", "remote-write"), ("prefill", "remote-write"),
    *(pytest.param(side, "mooncake", marks=_NEEDS_MOONCAKE) for side in ("decode", "prefill")),
])
def test_engines_talking_as_across_hosts_give_the_same_tokens(reference, tmp_path, side, transfer):
    """transport.kind tcp: the engines and the router talk over tcp:// (loopback), CURVE-
    authenticated with a shared token (transport/peer_auth.py), and every KV byte between engines
    is a remote write over TCP (engine/peers.py), each engine mapping only its own memory, as on
    separate hosts. The tokens are the recompute's, and the bytes written into peers are exactly
    each turn's prompt KV: the PD transfer of the new tokens plus the hit (sent by the PE on the PE
    path; streamed by the DE into the PE's landing zone, layer by layer, on the DE path). The same
    with the KV bytes through Mooncake Transfer Engine (transport.transfer mooncake, TCP here)."""
    token = tmp_path / "token"
    token.write_text("a deployment's shared secret\n")
    cfg = RuntimeConfig(model="tiny", mode="dualpath", force_read_side=side,
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        transport=TransportConfig(kind="tcp", peer_token_file=str(token), transfer=transfer), device=DEVICE)
    endpoints: list[str] = []
    data: list[str] = []
    outs, cached, summary = asyncio.run(cluster_conversation(cfg, endpoints, data_endpoints=data))
    assert all(ep.startswith("tcp://127.0.0.1:") for ep in endpoints) and len(set(endpoints)) == 3
    # where peers write: a WriteTarget's HOST:PORT, or a Mooncake address (its session and segments)
    assert all(MooncakeAddress.from_text(d).session.startswith("127.0.0.1:") if transfer == "mooncake"
               else d.startswith("127.0.0.1:") for d in data) and len(set(data)) == 2
    assert outs == reference
    prompts, context = [], 0
    for append, out in zip(TURNS, reference):
        prompts.append(context + len(append))
        context += len(append) + len(out)
    kv_bytes_per_token = load_model("tiny").model.config.kv_bytes_per_token_per_layer(torch.float32) * \
        load_model("tiny").model.config.num_layers
    assert summary["bytes"]["remote_writes"] == sum(prompts) * kv_bytes_per_token
    key = "storage_via_decode" if side == "decode" else "storage_to_prefill"
    assert summary["bytes"][key] == sum(cached) * kv_bytes_per_token > 0
