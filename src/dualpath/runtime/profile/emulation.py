"""Emulated NIC rates in the paper's regime on any machine, derived from the compute profile.

The paper's problem is a prefill engine that waits for storage: with one read path, loading a
turn's hit KV through the node's SNIC takes several times as long as computing its appended
tokens. We put the local cluster in that regime by choosing the SNIC rate from what this machine
computes, not from MB/s tuned on one CPU:

    SNIC bytes/s = sum over warm turns of hit bytes / (LOAD_OVER_COMPUTE * sum of their prefill s)

so that, on the workload, one SNIC needs LOAD_OVER_COMPUTE times the PE's compute time to load the
hits. LOAD_OVER_COMPUTE = 4.4 is DeepSeek-V3.2's at the paper's 64K MaxLen: a turn needs 34.9 GB of
KV per PFLOP of prefill (docs/hardware.md §6, C = 65,536), and one 400 Gbps SNIC supplies 7.9 GB per
PFLOP to a node of 8 Hopper GPUs at 40% MFU (docs/hardware.md §6; 40% is Fig. 1's GPU utilisation with
one read path, docs/paper.md §6.8): 34.9 / 7.9 = 4.4. (At the trace mean, 32K, it is 21.2 / 7.9 = 2.7.)

CNIC: a paper node has g = 8 GPUs, each with its own CNIC as fast as the node's one SNIC (docs/paper.md
§1.2). An emulated node here is one engine standing for the whole node, so its CNIC carries the
node's eight: CNIC = CNIC_PER_SNIC * SNIC. (With CNIC = SNIC the PE path's H2D and PD copies would
put 2x the SNIC's bytes on one CNIC, breaking the paper's bottleneck-free condition 2Bs/g <= B,
docs/paper.md §1.6, which holds only for g >= 2s.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...config import CNIC_PER_SNIC
from ...core.request import usable_hit_tokens
from .calibrate import ComputeProfile

LOAD_OVER_COMPUTE = 4.4  # fitted (Fig. 1): docs/hardware.md §6: 34.9 GB/PFLOP (DS-V3.2, 64K) / 7.9 GB/PFLOP (1 SNIC, Fig. 1's 40% MFU)


@dataclass(frozen=True, slots=True)
class TurnCost:
    """One turn as the runtime will see it: tokens hit in the store and tokens to compute."""

    hit_tokens: int
    new_tokens: int


@dataclass(frozen=True, slots=True)
class EmulatedRates:
    snic_bytes_per_s: float  # per node and direction
    cnic_bytes_per_s: float  # per node (one engine) and direction
    source: str  # "derived" (from the profile) or "given" (--snic-mb-s)
    load_over_compute: float  # the regime the rates were derived for (given: what they imply)
    predicted_basic_jct_s: float  # first-order: cold prefills + every hit through one SNIC

    def to_json(self) -> dict:
        return {"snic_bytes_per_s": self.snic_bytes_per_s, "cnic_bytes_per_s": self.cnic_bytes_per_s,
                "source": self.source, "load_over_compute": self.load_over_compute,
                "predicted_basic_jct_s": self.predicted_basic_jct_s}


def trajectory_turns(turns: Sequence[tuple[int, int]], block_tokens: int) -> list[TurnCost]:
    """(appended, generated) per round -> what each round hits and computes. Round i+1's prompt is
    the whole context; the store holds every full block whose KV was computed (all but the last
    generated token's, which is never fed back)."""
    out: list[TurnCost] = []
    context = 0
    for append, gen in turns:
        prompt = context + append
        stored = max(0, context - 1) // block_tokens * block_tokens
        hit = usable_hit_tokens(stored, prompt, block_tokens)
        out.append(TurnCost(hit, prompt - hit))
        context = prompt + gen
    return out


def warm_totals(profile: ComputeProfile, turns: Sequence[TurnCost], kv_bytes_per_token: int) -> tuple[int, float]:
    """(bytes the hits load, seconds the PE computes) over the turns that hit the store."""
    warm = [t for t in turns if t.hit_tokens]
    return (sum(t.hit_tokens for t in warm) * kv_bytes_per_token,
            sum(profile.prefill_s(t.new_tokens, t.hit_tokens) for t in warm))


def derive_rates(profile: ComputeProfile, turns: Sequence[TurnCost], kv_bytes_per_token: int,
                 load_over_compute: float = LOAD_OVER_COMPUTE) -> EmulatedRates:
    hit_bytes, compute_s = warm_totals(profile, turns, kv_bytes_per_token)
    if not hit_bytes:
        raise ValueError("no turn of the workload hits the store: nothing to derive a SNIC rate from")
    snic = hit_bytes / (load_over_compute * compute_s)
    return EmulatedRates(snic, CNIC_PER_SNIC * snic, "derived", load_over_compute,
                         predicted_basic_jct_s(profile, turns, kv_bytes_per_token, snic))


def given_rates(profile: ComputeProfile, turns: Sequence[TurnCost], kv_bytes_per_token: int,
                snic_bytes_per_s: float) -> EmulatedRates:
    """--snic-mb-s: the same record, with the regime that rate implies on this machine."""
    hit_bytes, compute_s = warm_totals(profile, turns, kv_bytes_per_token)
    ratio = hit_bytes / snic_bytes_per_s / compute_s if compute_s else 0.0
    return EmulatedRates(snic_bytes_per_s, CNIC_PER_SNIC * snic_bytes_per_s, "given", ratio,
                         predicted_basic_jct_s(profile, turns, kv_bytes_per_token, snic_bytes_per_s))


def predicted_basic_jct_s(profile: ComputeProfile, turns: Sequence[TurnCost], kv_bytes_per_token: int,
                          snic_bytes_per_s: float) -> float:
    """Basic mode's JCT to first order: the cold turns' prefill (nothing to load), then every hit
    through the PE's one SNIC (which the regime makes the bottleneck)."""
    cold_s = sum(profile.prefill_s(t.new_tokens, 0) for t in turns if not t.hit_tokens)
    load_s = sum(t.hit_tokens for t in turns) * kv_bytes_per_token / snic_bytes_per_s
    return cold_s + load_s
