"""Step times measured on this machine (core/measured.py): the `local` preset's compute model.

One engine per node (a node's "GPU" is the engine process): a forward takes the fixed cost, the
new tokens and the attention keys of its entries; a decode step is a function of its batch and its
longest context, as the runtime pads every sequence's KV to the longest (core/measured.py). The compute quota counts attention FLOPs at the
runtime's quota rate, as the runtime's PE does (runtime/engine/prefill.py: `attention_flops`), so
both worlds form the same batches.
"""

from __future__ import annotations

from ..config import SimConfig
from ..core.measured import MeasuredMachine, causal_keys
from .compute import ComputeModel, StepTimes


class MeasuredCompute(StepTimes):
    def __init__(self, machine: MeasuredMachine) -> None:
        self.m = machine
        self._quota_s_per_key = machine.attention_flops_per_key / machine.quota_attention_flops_per_s

    def attention_time_s(self, cached_tokens: int, compute_tokens: int) -> float:
        return self.m.prefill_per_key_s * causal_keys(compute_tokens, cached_tokens)

    def quota_attention_s(self, cached_tokens: int, compute_tokens: int) -> float:
        return self._quota_s_per_key * causal_keys(compute_tokens, cached_tokens)

    def prefill_forward_s(self, max_gpu_attention_s: float, total_compute_tokens: int) -> float:
        m = self.m
        return m.prefill_fixed_s + m.prefill_overhead_s + m.prefill_per_token_s * total_compute_tokens + max_gpu_attention_s

    def decode_request_cost(self, context_tokens: float) -> tuple[float, float]:
        """(its context, 0): the decode group keeps each request's context, the longest sets the step."""
        return context_tokens, 0.0

    def decode_step_s(self, max_gpu_attention_s: float, total_requests: int) -> float:
        raise NotImplementedError("measured decode steps are padded: padded_decode_step_s")

    def decode_pads_to_longest(self) -> bool:
        return True

    def padded_decode_step_s(self, batch: int, longest_context_tokens: float) -> float:
        return self.m.decode_step_s(batch, longest_context_tokens)

    def chunk_in_decode_s(self, cached_tokens: int, compute_tokens: int) -> float:
        """A prefill forward of the chunk between two decode steps, as a runtime DE would run it."""
        return self.prefill_forward_s(self.attention_time_s(cached_tokens, compute_tokens), compute_tokens)

    def prefill_only_step_s(self) -> float:
        return 0.0  # no decode step runs: the forward's own seconds are all

    def max_gpu_attention_s(self, attn_compute_s: list[float], kv_read_bytes: list[float]) -> float:
        return max(attn_compute_s)

    def prefill_tokens_per_s_per_gpu(self, context_tokens: int, miss_tokens: int, batch_requests: int) -> float:
        """The rate beta derives from, as the runtime's PE measures it (core/measured.py: the probe
        point), whatever the workload's mean turn."""
        return self.m.probe_prompt_tokens_per_s()


def compute_for(cfg: SimConfig) -> tuple[StepTimes, float, float]:
    """The run's compute model and (PE, DE) HBM bytes for KV per GPU, chosen once: measured step
    times, a landing zone and a KV cache in tokens for the `local` preset; the paper cluster's
    FLOPs model and the GPU's HBM less its weight shard (over its role's EP group) otherwise."""
    cl = cfg.cluster
    if cfg.local is not None:
        kvbpt = cl.model_spec.kv_bytes_per_token
        return MeasuredCompute(cfg.local), cfg.local.pe_landing_bytes, float(cfg.local.de_kv_tokens * kvbpt)
    compute = ComputeModel(cl.model_spec, cl.gpu_spec, cfg.compute, cl.node.gpus_per_node,
                           cl.weight_shards(cl.prefill_ep_nodes), cl.weight_shards(cl.decode_ep_nodes))
    return compute, cl.kv_hbm_bytes_per_gpu(cl.prefill_ep_nodes), cl.kv_hbm_bytes_per_gpu(cl.decode_ep_nodes)
