"""Cost model: FLOPs and bytes of prefill and decode work (docs/hardware.md §5.4, docs/paper.md §4.1).

All functions are pure arithmetic over a `ModelSpec`; converting FLOPs and bytes to seconds is the
simulator's compute model (or a runtime profile), not this module's job.
"""

from __future__ import annotations

from .models import ModelSpec

TABLE1_APPEND_TOKENS = 429  # docs/paper.md §4.1: mean append of the coding-agent trace


def _attended(model: ModelSpec, keys: float) -> float:
    return keys if model.attn_topk is None else min(keys, float(model.attn_topk))


def attention_flops_per_token(model: ModelSpec, context_tokens: float) -> float:
    """Attention FLOPs (scores + indexer + sliding windows) for one new token over `context_tokens` keys."""
    return (
        model.attn_flops_per_key * _attended(model, context_tokens)
        + model.indexer_flops_per_key * context_tokens
        + model.window_flops_per_token
    )


def flops_per_token(model: ModelSpec, context_tokens: float) -> float:
    """F(c) of docs/hardware.md §5.4: linear part plus attention over c keys."""
    return model.linear_flops_per_token + attention_flops_per_token(model, context_tokens)


def chunk_attention_flops(model: ModelSpec, cached_tokens: int, compute_tokens: int) -> float:
    """Attention FLOPs of computing `compute_tokens` new tokens after `cached_tokens` (causal).

    Token i (0-based) of the chunk attends cached + i + 1 keys. For dense attention the sum is
    closed-form; with top-k the attended count saturates at k, which is handled piecewise.
    """
    n = compute_tokens
    if n <= 0:
        return 0.0
    c0 = cached_tokens + 1
    keys_sum = n * c0 + n * (n - 1) / 2  # sum of (c0 + i) for i in [0, n)
    attended_sum = keys_sum
    k = model.attn_topk
    if k is not None:
        # tokens with c0 + i <= k attend c0 + i keys; the rest attend k
        m = k - c0 + 1  # max(0, min(n, k - c0 + 1)), written out (a hot path)
        if n < m:
            m = n
        if m < 0:
            m = 0
        attended_sum = m * c0 + m * (m - 1) / 2 + (n - m) * k
    return (
        model.attn_flops_per_key * attended_sum
        + model.indexer_flops_per_key * keys_sum
        + model.window_flops_per_token * n
    )


def chunk_flops(model: ModelSpec, cached_tokens: int, compute_tokens: int) -> float:
    return model.linear_flops_per_token * compute_tokens + chunk_attention_flops(model, cached_tokens, compute_tokens)


def decode_kv_read_bytes(model: ModelSpec, context_tokens: float) -> float:
    """KV bytes one decode step reads for one request with `context_tokens` keys."""
    return (
        model.decode_attended_bytes_per_key * _attended(model, context_tokens)
        + model.decode_indexed_bytes_per_key * context_tokens
    )


def kv_bytes(model: ModelSpec, tokens: int) -> int:
    return tokens * model.kv_bytes_per_token


def cache_compute_ratio_gb_per_pflop(
    model: ModelSpec, context_tokens: int, append_tokens: int = TABLE1_APPEND_TOKENS
) -> float:
    """Table 1's cache-compute ratio: KV bytes loaded / prefill FLOPs, in GB per PFLOP.

    Paper convention (docs/paper.md §4.1, docs/hardware.md §6): C cached tokens are loaded; each of the A
    appended tokens costs F(C), attention over the C cached keys only; KV as in Table 1.
    """
    loaded = context_tokens * model.kv_layers * model.table1_kv_bytes_per_token_per_layer
    flops = append_tokens * flops_per_token(model, context_tokens)
    return (loaded / 1e9) / (flops / 1e15)
