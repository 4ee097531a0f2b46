"""Shape of a Llama-family decoder, and the identity that KV blocks are checked against.

`LlamaConfig` is what the model, the KV layout and the KV store agree on. Its `fingerprint()`
covers the architecture and `weights_id` (a content hash of the weight files, or the seed of a
random model), so a KV block written by one model is never read by another.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Protocol

from dualpath.core.blocks import BLOCK_TOKENS_DEFAULT, BlockLayout

ROPE_SCALING_KINDS = ("linear", "llama3")


class HasItemSize(Protocol):
    """A dtype: `torch.dtype` and `numpy.dtype` both qualify."""

    @property
    def itemsize(self) -> int: ...


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """RoPE frequency scaling, as in Hugging Face `rope_scaling`.

    `linear` divides every frequency by `factor`; `llama3` divides only the low frequencies, with
    a smooth ramp between `low_freq_factor` and `high_freq_factor` (Llama 3.1).
    """

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALING_KINDS:
            raise ValueError(f"rope scaling kind {self.kind!r} not in {ROPE_SCALING_KINDS}")
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be positive, got {self.factor}")


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_tokens: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    rope_scaling: RopeScaling | None = None
    weights_id: str = ""  # content hash of the weights (or the random seed); part of the fingerprint

    def __post_init__(self) -> None:
        sizes = (self.vocab_size, self.hidden_size, self.intermediate_size, self.num_layers,
                 self.num_heads, self.num_kv_heads, self.head_dim, self.max_position_tokens)
        if min(sizes) <= 0:
            raise ValueError(f"LlamaConfig sizes must be positive: {self}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_theta <= 0 or self.rms_norm_eps <= 0:
            raise ValueError("rope_theta and rms_norm_eps must be positive")
        for t in (self.bos_token_id, *self.eos_token_ids):
            if t is not None and not 0 <= t < self.vocab_size:
                raise ValueError(f"special token id {t} outside the vocabulary [0, {self.vocab_size})")

    @property
    def num_query_groups(self) -> int:
        """Query heads that share one KV head (GQA)."""
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token_per_layer(self, dtype: HasItemSize) -> int:
        """K and V of one token in one layer: 2 * num_kv_heads * head_dim elements."""
        return 2 * self.num_kv_heads * self.head_dim * dtype.itemsize

    def block_layout(self, dtype: HasItemSize, block_tokens: int = BLOCK_TOKENS_DEFAULT) -> BlockLayout:
        return BlockLayout(self.num_layers, block_tokens, self.kv_bytes_per_token_per_layer(dtype))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def fingerprint(self, kv_dtype: object | None = None) -> str:
        """Stable hex digest of the architecture, the weights' identity and (optionally) the KV dtype.

        Equal fingerprints mean KV blocks are interchangeable between the two models.
        """
        payload = self.to_dict()
        payload["kv_dtype"] = None if kv_dtype is None else str(kv_dtype).removeprefix("torch.")
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
