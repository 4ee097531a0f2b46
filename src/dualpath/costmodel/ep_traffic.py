"""Bytes of expert-parallel dispatch and combine that cross the compute network.

The model's own communication is what the latency-critical lane protects (docs/paper.md §2.3): in the
MoE presets it is the EP all-to-all of every MoE layer of every prefill forward and decode step.
With the EP group spanning all nodes of a role ([I] docs/paper.md §5: "likely node-spanning, e.g. EP16 for
prefill and EP32 for decode in 2P4D"; the simulator already shards the weights that way,
ClusterConfig.weight_shards), a token's experts sit on other nodes with probability (N - 1) / N,
and those bytes leave through the GPU's CNIC (DeepEP internode: RDMA; intranode: NVLink, not the
CNIC) [S-DEP, docs/hardware.md §1.2].

Per token and MoE layer, what one GPU sends (and, EP being symmetric on average, receives):
- dispatch: the hidden state in FP8 with one FP32 scale per 128 values, hidden + hidden / 128 * 4 B
  (DeepEP's FP8 dispatch);
- combine: the expert output in BF16, 2 * hidden B.
Decode uses DeepEP's low-latency kernels, one message per selected expert: top_k * (N - 1) / N
copies. Prefill uses the normal kernels, one message per destination *node* (NVLink forwards inside
it): the expected number of other nodes holding one of the k experts, (N - 1) * (1 - (1 - 1/N)^k).

Check against DeepEP's measured low-latency kernels (docs/hardware.md §1.2: 77-194 us dispatch, 114-369 us
combine at 128 tokens, EP8-EP256): DS 660B, 128 tokens per GPU, EP32 over 4 nodes moves 5.7 MB
dispatch + 11.0 MB combine per layer, 114 + 220 us at 50 GB/s: within the measured range, and the
0.29 ms per layer that ComputeKnobs.ep_latency_per_layer_s charges unloaded.
"""

from __future__ import annotations

from dataclasses import dataclass

FP8_SCALE_GROUP_VALUES = 128  # DeepEP FP8 dispatch: one FP32 scale per 128 values [S-DEP]
FP32_SCALE_BYTES = 4
BF16_BYTES = 2


@dataclass(frozen=True, slots=True)
class MoeShape:
    hidden: int
    moe_layers: int
    top_k: int  # routed experts per token (shared experts run locally, DP)
    source: str

    @property
    def dispatch_bytes_per_copy(self) -> int:
        return self.hidden + self.hidden // FP8_SCALE_GROUP_VALUES * FP32_SCALE_BYTES

    @property
    def combine_bytes_per_copy(self) -> int:
        return BF16_BYTES * self.hidden


MOE_SHAPES: dict[str, MoeShape] = {
    # docs/hardware.md §5.1: 61 layers, 3 dense -> 58 MoE; hidden 7,168; 8 of 256 routed experts
    "ds-v3.2-660b": MoeShape(7168, 58, 8, "docs/hardware.md §5.1 (config_671B_v3.2.json)"),
    "ds-v3-660b": MoeShape(7168, 58, 8, "docs/hardware.md §5.1 (config_671B.json)"),
    # docs/paper.md §5 / docs/hardware.md §5.1: 30 layers, 1 dense -> 29 MoE; hidden 2,560; 6 of 72 routed experts
    "ds-27b": MoeShape(2560, 29, 6, "docs/paper.md §5 (DS 27B)"),
}


def decode_bytes_per_token(shape: MoeShape, nodes: int) -> float:
    """Bytes one GPU sends over its CNIC per decode token, all MoE layers (low-latency kernels)."""
    if nodes < 1:
        raise ValueError("an EP group spans at least one node")
    remote = shape.top_k * (nodes - 1) / nodes
    return shape.moe_layers * remote * (shape.dispatch_bytes_per_copy + shape.combine_bytes_per_copy)


def prefill_bytes_per_token(shape: MoeShape, nodes: int) -> float:
    """Bytes one GPU sends over its CNIC per prefill token, all MoE layers (normal kernels: one
    copy per destination node)."""
    if nodes < 1:
        raise ValueError("an EP group spans at least one node")
    other_nodes = (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** shape.top_k)
    return shape.moe_layers * other_nodes * (shape.dispatch_bytes_per_copy + shape.combine_bytes_per_copy)
