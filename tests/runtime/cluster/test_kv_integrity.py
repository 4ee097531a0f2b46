"""Bits flipped in flight on the layer stream and the PD transfer (RuntimeConfig.
kv_corrupt_probability) are caught by the receiver's checksums and never used: the tokens are the
ones recomputing from scratch gives, and the engines' counters show the detections (tiny model,
real engine processes)."""

import asyncio
import time

import pytest

from dualpath.config import EngineConfig, FaultConfig, RuntimeConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from dualpath.runtime.model import load_model
from dualpath.runtime.transport.integrity import LAYER_RETRANSMITS_MAX
from persist_wait import wait_chain_stored

TURNS = [list(range(5, 205)), list(range(30, 100))]  # turn 2 reads turn 1's 3 full blocks
GEN = 8
FLIP_PROBABILITY = 0.3  # per block piece: a few flips per turn on each path, some loads out of tries


def recompute_reference() -> list[list[int]]:
    m = load_model("tiny").model
    context, outs = [], []
    for append in TURNS:
        ids, out = context + append, []
        for _ in range(GEN):
            t = int(m.forward(ids)[-1].argmax())
            out.append(t)
            ids = ids + [t]
        outs.append(out)
        context = context + append + out
    return outs


async def corrupted_conversation(cfg: RuntimeConfig) -> tuple[list[list[int]], dict]:
    async with LocalCluster(cfg, start_timeout_s=180) as c:
        context, outs = [], []
        for i, append in enumerate(TURNS):
            prompt = tuple(context + append)
            params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True, min_tokens=GEN)
            out = [ev.token_id async for ev in c.router.generate(GenerationRequest(f"t{i}", prompt, params))]
            outs.append(out)
            context = list(prompt) + out
            await wait_chain_stored(c.router.store, context[:-1], cfg.block_tokens)
        deadline = time.monotonic() + 5.0  # engines report counters every 0.5 s
        while time.monotonic() < deadline:
            got = c.router.metrics.integrity()
            if got["layer_checksum_failures"] and got["pd_checksum_failures"]:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.6)
        return outs, c.router.metrics.integrity()


@pytest.fixture(scope="module")
def reference():
    return recompute_reference()


def _config(side: str, probability: float) -> RuntimeConfig:
    return RuntimeConfig(model="tiny", force_read_side=side, faults=FaultConfig(kv_corrupt_probability=probability),
                         engines=EngineConfig(host_buffer_bytes=16 * 2**20, pe_hbm_bytes=16 * 2**20, de_kv_tokens=2048))


def test_flipped_bits_in_flight_are_caught_and_tokens_match_recompute(reference):
    """PE read side: the layer stream comes from the PE's own buffer; some loads pass on a retry."""
    outs, got = asyncio.run(corrupted_conversation(_config("prefill", FLIP_PROBABILITY)))
    assert outs == reference
    assert got["layer_checksum_failures"] > 0  # turn 2's hit, streamed layer by layer to the PE
    assert got["pd_checksum_failures"] > 0  # each turn's new KV into the DE
    assert got["layer_retransmits"] > 0 and got["kv_recomputes"] > 0
    # every detection is an injected flip (a flip in a discarded forward's output may go unchecked)
    assert got["layer_checksum_failures"] + got["pd_checksum_failures"] <= got["kv_flips_injected"]


def test_every_piece_flipped_exhausts_retries_and_both_engines_recompute(reference):
    """DE read side, every piece flipped: turn 2's layer 0 load (3 hit blocks, pulled from the DE)
    fails 1 + LAYER_RETRANSMITS_MAX times, 3 pieces a time; layer 1's load, issued with layer 0's
    (layerwise: 2 layers in flight), fails once; layers 2-3 are not loaded (the item is poisoned, its
    outputs discarded). The PE then recomputes the prompt, and the DE recomputes both turns' prompts (every PD piece fails: turn 1
    4 blocks x 4 layers, turn 2 after the restart 5 x 4; the poisoned forward's are never checked)."""
    outs, got = asyncio.run(corrupted_conversation(_config("decode", 1.0)))
    assert outs == reference
    assert got["layer_retransmits"] == LAYER_RETRANSMITS_MAX
    assert got["layer_checksum_failures"] == 3 * (1 + LAYER_RETRANSMITS_MAX) + 3
    assert got["pd_checksum_failures"] == 4 * 4 + 5 * 4
    assert got["kv_recomputes"] == 1 + 2  # the PE once, the DE per turn


def test_flip_probability_outside_0_1_is_refused():
    from dualpath.errors import InputError

    for bad in (-0.1, 1.5):
        with pytest.raises(InputError, match="kv_corrupt_probability"):
            _config("prefill", bad)


def test_integrity_acceptance_bad_input_is_one_line_error():
    from cli_helpers import cli_here

    for args in (["--corruptions", "-1"], ["--torn-writes", "-5"], ["--corruptions", "10", "--flip-probability", "0"]):
        r = cli_here("chaos", *args)
        assert r.returncode == 2 and (r.stdout + r.stderr).count("error:") == 1, (args, r.stdout, r.stderr)
