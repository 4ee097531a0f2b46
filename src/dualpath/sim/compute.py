"""Compute model: seconds for a PE forward and a DE decode step, from FLOPs and bytes.

Prefill forward of a PE group (one node, DP attention + EP, all GPUs in lockstep):
    t = layers * ep_latency + max_gpu(attention FLOPs) / (bf16 peak * attn_efficiency)
        + max(sum_gpu(linear FLOPs) / num_gpus / (linear peak * prefill_mfu),
              weights per GPU / (HBM * hbm_eff))
Attention is per GPU (DP attention: a request lives on one GPU; the slowest GPU sets the pace);
linear work (dense + experts) is spread over the group by expert parallelism, and cannot take
less than reading the GPU's weights once (small batches are memory-bound).

Decode step of a DE group (continuous batching, lockstep):
    t = layers * ep_latency + max_gpu(max(attn FLOPs / (bf16 * attn_eff), KV bytes / (HBM * hbm_eff)))
        + max(linear FLOPs / num_gpus / (peak * decode_mfu), weights per GPU / (HBM * hbm_eff))

Every efficiency is a calibration knob with a source in `ComputeKnobs`. The fixed per-layer cost
is the expert-parallel dispatch + combine latency; Fig. 3's batching curve (docs/paper.md §4.1) (x2.6 at 5
requests, x2.9 at 10, x3.0 at 20) is then mostly the DP-attention structure itself: one request
occupies one GPU's attention while the group's linear work is shared (`fig3_relative_throughput`).
"""

from __future__ import annotations

from ..costmodel.cost import chunk_attention_flops, decode_kv_read_bytes, attention_flops_per_token
from ..costmodel.models import ModelSpec
from ..config import ComputeKnobs
from ..costmodel.hardware import GpuSpec


FIG3_CONTEXT_TOKENS = 30_000  # docs/paper.md §4.1, Fig. 3 right: 30K context, 300 appended tokens
FIG3_APPEND_TOKENS = 300


class StepTimes:
    """What the simulator's components ask of a compute model (chosen once, Simulator.__init__):
    the FLOPs-and-bytes `ComputeModel` of a paper cluster below, or the measured step times of
    this machine (compute_measured.py, the `local` preset)."""

    def attention_time_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """One batch entry's attention seconds in a forward."""
        raise NotImplementedError

    def quota_attention_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """One batch entry's cost against the compute quota (docs/paper.md §3.5), in seconds."""
        raise NotImplementedError

    def prefill_forward_s(self, max_gpu_attention_s: float, total_compute_tokens: int) -> float:
        raise NotImplementedError

    def decode_request_cost(self, context_tokens: float) -> tuple[float, float]:
        """(attention seconds, KV bytes read) one request adds to its GPU per decode step."""
        raise NotImplementedError

    def decode_step_s(self, max_gpu_attention_s: float, total_requests: int) -> float:
        raise NotImplementedError

    def decode_pads_to_longest(self) -> bool:
        """Whether a decode step's time is a function of its batch and its longest context
        (`padded_decode_step_s`) rather than of summed per-request costs (`decode_step_s`)."""
        return False

    def padded_decode_step_s(self, batch: int, longest_context_tokens: float) -> float:
        raise NotImplementedError

    def chunk_in_decode_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """Seconds a DE's decode steps take longer, in all, for prefilling `compute_tokens` after
        `cached_tokens` of hit in them (`+selective`, decode.py: chunked into the steps)."""
        raise NotImplementedError

    def prefill_only_step_s(self) -> float:
        """A decode step's own seconds when it carries prefill chunks and no decoding request."""
        raise NotImplementedError

    def max_gpu_attention_s(self, attn_compute_s: list[float], kv_read_bytes: list[float]) -> float:
        raise NotImplementedError

    def prefill_tokens_per_s_per_gpu(self, context_tokens: int, miss_tokens: int, batch_requests: int) -> float:
        raise NotImplementedError


class ComputeModel(StepTimes):
    def __init__(self, model: ModelSpec, gpu: GpuSpec, knobs: ComputeKnobs, gpus_per_group: int,
                 prefill_weight_shards: int, decode_weight_shards: int) -> None:
        self.model = model
        self.gpu = gpu
        self.knobs = knobs
        self.gpus_per_group = gpus_per_group
        linear_peak = gpu.fp8_flops_per_s if model.linear_dtype == "fp8" else gpu.bf16_flops_per_s
        self._linear_rate = linear_peak * knobs.prefill_mfu
        self._decode_linear_rate = linear_peak * knobs.decode_mfu
        self._attn_rate = gpu.bf16_flops_per_s * knobs.attn_efficiency
        self._hbm_rate = gpu.hbm_bytes_per_s * knobs.decode_hbm_efficiency
        self.prefill_weight_read_s = model.weight_bytes / prefill_weight_shards / self._hbm_rate
        self.decode_weight_read_s = model.weight_bytes / decode_weight_shards / self._hbm_rate
        self.decode_overhead_s = knobs.ep_latency_per_layer_s * model.num_layers
        self.prefill_overhead_s = knobs.ep_latency_per_layer_s * model.num_layers
        if knobs.prefill_forward_overhead_s is not None:
            self.prefill_overhead_s += knobs.prefill_forward_overhead_s
        else:
            # Fig. 3 rule: t0 = ratio * t1, t1 = one 30K/300 request on one engine (GPU)
            t1 = self.attention_time_s(FIG3_CONTEXT_TOKENS, FIG3_APPEND_TOKENS) + max(
                model.linear_flops_per_token * FIG3_APPEND_TOKENS / self._linear_rate, self.prefill_weight_read_s)
            self.prefill_overhead_s = max(self.prefill_overhead_s, knobs.fig3_overhead_per_request_ratio * t1)

    # --- prefill -------------------------------------------------------------------------
    def attention_time_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """Predicted attention time of one batch entry: the compute-quota cost (docs/paper.md §3.5)."""
        return chunk_attention_flops(self.model, cached_tokens, compute_tokens) / self._attn_rate

    def quota_attention_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """The quota counts predicted attention time (docs/paper.md §3.5)."""
        return self.attention_time_s(cached_tokens, compute_tokens)

    def prefill_forward_s(self, max_gpu_attention_s: float, total_compute_tokens: int) -> float:
        linear = self.model.linear_flops_per_token * total_compute_tokens / self.gpus_per_group / self._linear_rate
        weights = self.prefill_weight_read_s
        return self.prefill_overhead_s + max_gpu_attention_s + (weights if weights > linear else linear)  # max(linear, weights)

    # --- decode --------------------------------------------------------------------------
    def decode_request_cost(self, context_tokens: float) -> tuple[float, float]:
        """(attention seconds of compute, KV bytes read) one request adds to its GPU per step."""
        flops = attention_flops_per_token(self.model, context_tokens)
        return flops / self._attn_rate, decode_kv_read_bytes(self.model, context_tokens)

    def decode_step_s(self, max_gpu_attention_s: float, total_requests: int) -> float:
        linear = self.model.linear_flops_per_token * total_requests / self.gpus_per_group / self._decode_linear_rate
        weights = self.decode_weight_read_s
        return self.decode_overhead_s + max_gpu_attention_s + (weights if weights > linear else linear)  # max(linear, weights)

    def chunk_in_decode_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """The chunks' attention on their GPU plus their linear FLOPs spread over the group at the
        prefill MFU; the step already pays the per-layer EP latency and reads the weights once."""
        linear = self.model.linear_flops_per_token * compute_tokens / self.gpus_per_group / self._linear_rate
        return self.attention_time_s(cached_tokens, compute_tokens) + linear

    def prefill_only_step_s(self) -> float:
        return self.decode_step_s(0.0, 0)

    def gpu_attention_s(self, attn_compute_s: float, kv_read_bytes: float) -> float:
        """A GPU's decode attention time: compute- or memory-bound, whichever is slower."""
        return max(attn_compute_s, kv_read_bytes / self._hbm_rate)

    def max_gpu_attention_s(self, attn_compute_s: list[float], kv_read_bytes: list[float]) -> float:
        """The slowest GPU of a group: `gpu_attention_s` per GPU, maximised (the first of equals, as
        max(); written out: this runs at every decode join and finish, and a two-argument max()
        costs more than the comparison)."""
        rate = self._hbm_rate
        worst = 0.0
        first = True
        for attn, kv in zip(attn_compute_s, kv_read_bytes):
            memory = kv / rate
            gpu = memory if memory > attn else attn
            if first or gpu > worst:
                worst = gpu
                first = False
        if first:
            raise ValueError("max_gpu_attention_s() of no GPU")
        return worst

    def prefill_tokens_per_s_per_gpu(self, context_tokens: int, miss_tokens: int, batch_requests: int) -> float:
        """Prompt tokens one GPU processes per second on a steady stream of such requests, every
        GPU of the group taking `batch_requests` per forward: the profile behind beta (docs/paper.md §3.2)."""
        attn = self.attention_time_s(context_tokens - miss_tokens, miss_tokens) * batch_requests
        t = self.prefill_forward_s(attn, miss_tokens * batch_requests * self.gpus_per_group)
        return context_tokens * batch_requests / t

    def fig3_relative_throughput(self, requests_per_forward: int) -> float:
        """Token throughput of a group forward with n requests of 30K context + 300 new tokens
        (spread over the GPUs), relative to one request: docs/paper.md §4.1 Fig. 3 right [F] reads 2.6 / 2.9 /
        3.0 at 5 / 10 / 20."""
        def forward_s(n: int) -> float:
            per_gpu = -(-n // self.gpus_per_group)
            attn = per_gpu * self.attention_time_s(FIG3_CONTEXT_TOKENS, FIG3_APPEND_TOKENS)
            return self.prefill_forward_s(attn, n * FIG3_APPEND_TOKENS)
        return requests_per_forward * forward_s(1) / forward_s(requests_per_forward)
