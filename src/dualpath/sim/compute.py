"""Compute model: seconds for a PE forward and a DE decode step, from FLOPs and bytes.

Prefill forward of a PE group (one node, DP attention + EP, all GPUs in lockstep):
    t = prefill_overhead_s + max_gpu(attention FLOPs) / (bf16 peak * attn_efficiency)
        + sum_gpu(linear FLOPs) / num_gpus / (linear peak * prefill_mfu)
Attention is per GPU (DP attention: a request lives on one GPU; the slowest GPU sets the pace);
linear work (dense + experts) is spread over the group by expert parallelism.

Decode step of a DE group (continuous batching, lockstep):
    t = decode_overhead_s + max_gpu(max(attn FLOPs / (bf16 * attn_eff), KV bytes / (HBM * hbm_eff)))
        + max(linear FLOPs / num_gpus / (peak * decode_mfu), weights per GPU / (HBM * hbm_eff))

Every efficiency is a calibration knob with a source in `ComputeKnobs`.
"""

from __future__ import annotations

from ..core.cost import chunk_attention_flops, decode_kv_read_bytes, attention_flops_per_token
from ..core.models import ModelSpec
from ..config import ComputeKnobs
from ..core.hardware import GpuSpec


FIG3_CONTEXT_TOKENS = 30_000  # PAPER.md 4.1, Fig. 3 right: 30K context, 300 appended tokens
FIG3_APPEND_TOKENS = 300


class ComputeModel:
    def __init__(self, model: ModelSpec, gpu: GpuSpec, knobs: ComputeKnobs, gpus_per_group: int, weight_shards: int) -> None:
        self.model = model
        self.gpu = gpu
        self.knobs = knobs
        self.gpus_per_group = gpus_per_group
        linear_peak = gpu.fp8_flops_per_s if model.linear_dtype == "fp8" else gpu.bf16_flops_per_s
        self._linear_rate = linear_peak * knobs.prefill_mfu
        self._decode_linear_rate = linear_peak * knobs.decode_mfu
        self._attn_rate = gpu.bf16_flops_per_s * knobs.attn_efficiency
        self._hbm_rate = gpu.hbm_bytes_per_s * knobs.decode_hbm_efficiency
        self.weight_bytes_per_gpu = model.weight_bytes / weight_shards
        if knobs.prefill_overhead_s is not None:
            self.prefill_overhead_s = knobs.prefill_overhead_s
        else:
            t1 = self.attention_time_s(FIG3_CONTEXT_TOKENS, FIG3_APPEND_TOKENS) + (
                model.linear_flops_per_token * FIG3_APPEND_TOKENS / self._linear_rate
            )
            self.prefill_overhead_s = knobs.prefill_overhead_per_request_ratio * t1
        self.decode_overhead_s = knobs.decode_overhead_per_layer_s * model.num_layers

    # --- prefill -------------------------------------------------------------------------
    def attention_time_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """Predicted attention time of one batch entry: the compute-quota cost (PAPER.md 3.5)."""
        return chunk_attention_flops(self.model, cached_tokens, compute_tokens) / self._attn_rate

    def prefill_forward_s(self, max_gpu_attention_s: float, total_compute_tokens: int) -> float:
        linear = self.model.linear_flops_per_token * total_compute_tokens / self.gpus_per_group / self._linear_rate
        return self.prefill_overhead_s + max_gpu_attention_s + linear

    # --- decode --------------------------------------------------------------------------
    def decode_request_cost(self, context_tokens: float) -> tuple[float, float]:
        """(attention seconds of compute, KV bytes read) one request adds to its GPU per step."""
        flops = attention_flops_per_token(self.model, context_tokens)
        return flops / self._attn_rate, decode_kv_read_bytes(self.model, context_tokens)

    def decode_step_s(self, max_gpu_attention_s: float, total_requests: int) -> float:
        linear = self.model.linear_flops_per_token * total_requests / self.gpus_per_group / self._decode_linear_rate
        weights = self.weight_bytes_per_gpu / self._hbm_rate
        return self.decode_overhead_s + max_gpu_attention_s + max(linear, weights)

    def gpu_attention_s(self, attn_compute_s: float, kv_read_bytes: float) -> float:
        """A GPU's decode attention time: compute- or memory-bound, whichever is slower."""
        return max(attn_compute_s, kv_read_bytes / self._hbm_rate)

    def prefill_tokens_per_s_per_gpu(self, context_tokens: int, miss_tokens: int, batch_requests: int) -> float:
        """Prompt tokens one GPU processes per second on a steady stream of such requests in
        batches of `batch_requests` per GPU: the profile behind beta (PAPER.md 3.2)."""
        attn = self.attention_time_s(context_tokens - miss_tokens, miss_tokens) * batch_requests
        linear = self.model.linear_flops_per_token * miss_tokens * batch_requests / self._linear_rate
        t = self.prefill_overhead_s + attn + linear
        return context_tokens * batch_requests / t
