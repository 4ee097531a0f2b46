"""Compute model arithmetic on a hand-made model and GPU (numbers chosen to compute by hand)."""

import pytest

from dualpath.config import ComputeKnobs
from dualpath.costmodel.hardware import GpuSpec
from dualpath.costmodel.models import ModelSpec
from dualpath.sim.compute import ComputeModel

TOY = ModelSpec(
    name="toy", num_layers=10, kv_layers=10, kv_bytes_per_token_per_layer=100, table1_kv_bytes_per_token_per_layer=100,
    linear_flops_per_token=1e9, attn_flops_per_key=1e6, attn_topk=None, indexer_flops_per_key=0.0,
    window_flops_per_token=0.0, decode_attended_bytes_per_key=1000, decode_indexed_bytes_per_key=0,
    weight_bytes=8e9, linear_dtype="fp8", source="test",
)
GPU = GpuSpec("toy", fp8_flops_per_s=1e15, bf16_flops_per_s=5e14, hbm_bytes=80e9, hbm_bytes_per_s=1e12)
KNOBS = ComputeKnobs(prefill_mfu=0.5, attn_efficiency=0.5, ep_latency_per_layer_s=1e-3, decode_hbm_efficiency=0.5,
                     decode_mfu=0.25, prefill_forward_overhead_s=0.0)


def cm(prefill_shards=8, decode_shards=8, knobs=KNOBS):
    return ComputeModel(TOY, GPU, knobs, gpus_per_group=4, prefill_weight_shards=prefill_shards, decode_weight_shards=decode_shards)


def test_fig3_rule_sets_the_forward_overhead_to_a_multiple_of_one_requests_time():
    from dataclasses import replace

    m = cm(knobs=replace(KNOBS, prefill_forward_overhead_s=None, fig3_overhead_per_request_ratio=2.5))
    # t1 = attention(30000 cached, 300 new) + max(linear 300 tokens on one GPU, weight read)
    attn = m.attention_time_s(30000, 300)
    linear = 300 * 1e9 / 5e14
    assert m.prefill_overhead_s == pytest.approx(2.5 * (attn + max(linear, 0.002)))


def test_attention_time_is_causal_flops_over_bf16_rate():
    # 10 new tokens after 100 cached: keys 101..110, sum = 1055 -> 1.055e9 FLOPs at 2.5e14 FLOP/s
    assert cm().attention_time_s(100, 10) == pytest.approx(1.055e9 / 2.5e14)


def test_prefill_forward_adds_layer_latency_attention_and_linear_or_weight_floor():
    m = cm()
    # linear: 4000 tokens * 1e9 / 4 GPUs / 5e14 = 2 ms; weights: 1e9 B per GPU / 5e11 B/s = 2 ms
    assert m.prefill_forward_s(0.003, 4000) == pytest.approx(0.010 + 0.003 + 0.002)
    # small batch: the weight read (2 ms) is the floor
    assert m.prefill_forward_s(0.0, 4) == pytest.approx(0.010 + 0.002)
    # big batch: linear dominates (40000 tokens -> 20 ms)
    assert m.prefill_forward_s(0.0, 40000) == pytest.approx(0.010 + 0.020)


def test_decode_step_is_memory_or_compute_bound_per_gpu():
    m = cm(decode_shards=2)  # 4e9 B of weights per GPU -> 8 ms at 5e11 B/s
    attn_s, kv_bytes = m.decode_request_cost(1000)
    assert attn_s == pytest.approx(1e6 * 1000 / 2.5e14)
    assert kv_bytes == pytest.approx(1000 * 1000)
    gpu = m.gpu_attention_s(attn_s, kv_bytes)  # memory: 1e6 B / 5e11 = 2 us > compute 4 us? no: 4e-6
    assert gpu == pytest.approx(max(4e-6, 2e-6))
    # 8 requests: linear 8 * 1e9 / 4 / 2.5e14 = 8 us < weights 8 ms
    assert m.decode_step_s(gpu, 8) == pytest.approx(0.010 + gpu + 0.008)


def test_more_requests_per_forward_raise_throughput_until_attention_dominates():
    m = cm()
    r = [m.fig3_relative_throughput(n) for n in (1, 2, 4, 8, 16)]
    assert r[0] == pytest.approx(1.0)
    assert all(b >= a for a, b in zip(r, r[1:]))


def test_group_worst_attention_is_the_slowest_gpu_either_bound():
    m = cm()
    # hbm rate 5e11 B/s: GPU 0 compute-bound (3 us vs 2 us), GPU 1 memory-bound (1 us vs 6 us), GPU 2 idle
    attn, kv = [3e-6, 1e-6, 0.0], [1e6, 3e6, 0.0]
    assert m.max_gpu_attention_s(attn, kv) == max(m.gpu_attention_s(a, b) for a, b in zip(attn, kv))
    assert m.max_gpu_attention_s(attn, kv) == pytest.approx(6e-6)
