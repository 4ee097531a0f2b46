"""Llama-family decoder in one file: RMSNorm, RoPE, grouped-query attention, SwiGLU, optional tied
embeddings. Numerically the same as Hugging Face `LlamaForCausalLM`.

Three ways to run it (all without autograd):

1. `forward(token_ids)`: full recompute, no cache; the reference the other two are tested against.
2. Layerwise prefill (docs/paper.md §1.1: the GPU holds only one layer's KV of the batch at a time):
     state = begin_prefill(items)                       # embeddings of every item's new tokens
     for layer in range(num_layers):
         new_kv = prefill_layer(state, layer, cached_kv)   # cached_kv: this layer's hit KV per item
     logits = finish_prefill(state)                     # last token of each item
   Items are packed back to back (varlen batching): the linear layers run once over all new
   tokens; attention runs per item, causal over the new tokens and full over the cached ones.
3. Paged decode with continuous batching: `decode_step(cache, seq_ids, last_token_ids)` appends each
   sequence's new K,V to a `PagedKVCache` and attends over its blocks; sequences may differ in length.

Shape letters: T new tokens of a batch (packed), N items, B decode sequences, L key positions,
C hidden_size, H num_heads, G num_kv_heads, R = H / G query heads per KV head, D head_dim, V vocab.
The fused K,V projection writes [T, 2, G, D]: exactly the Layer Block layout (kv_layout.py).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dualpath.runtime.model.config import LlamaConfig
from dualpath.runtime.model.kv_layout import LayerKV
from dualpath.runtime.model.paged_cache import PagedKVCache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()  # normalise in float32 whatever the weights' dtype, as Hugging Face does
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """Inverse frequencies [D/2] (float32), with `config.rope_scaling` applied."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq.float()
    if scaling.kind == "linear":
        return (inv_freq / scaling.factor).float()
    # llama3: long wavelengths divided by factor, short ones kept, a smooth ramp in between
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = scaling.original_max_position_tokens / scaling.low_freq_factor
    high_wavelen = scaling.original_max_position_tokens / scaling.high_freq_factor
    smooth = (scaling.original_max_position_tokens / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    ramp = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(middle, ramp, scaled).float()


def rope_cos_sin(
    inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [..., D] for integer positions [...], computed in float32."""
    freqs = positions.float()[..., None] * inv_freq  # [..., D/2]
    angles = torch.cat((freqs, freqs), dim=-1)  # [..., D]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., heads, D] by cos/sin [..., D] (rotate-half convention)."""
    x1, x2 = x.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos[..., None, :] + rotated * sin[..., None, :]


class Block(nn.Module):
    """One decoder layer. Attention itself lives in the model's three run modes; the block provides
    the projections before it (`qkv`) and everything after it (`finish`)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        c, h, g, d = config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim
        self.head_shape = (h, g, d)  # (H, G, D)
        self.attn_norm = RMSNorm(c, config.rms_norm_eps)
        self.wq = nn.Linear(c, h * d, bias=False)
        self.wkv = nn.Linear(c, 2 * g * d, bias=False)  # rows: K (G*D) then V (G*D)
        self.wo = nn.Linear(h * d, c, bias=False)
        self.mlp_norm = RMSNorm(c, config.rms_norm_eps)
        self.w_gate = nn.Linear(c, config.intermediate_size, bias=False)
        self.w_up = nn.Linear(c, config.intermediate_size, bias=False)
        self.w_down = nn.Linear(config.intermediate_size, c, bias=False)
        # tensor parallelism (tensor_parallel.py): None runs the MLP here; otherwise a callable
        # xn [..., C] -> MLP output [..., C] that splits it across ranks
        self.mlp_hook: Callable[[torch.Tensor], torch.Tensor] | None = None

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [..., C] -> q [..., H, D] and kv [..., 2, G, D], both with RoPE applied."""
        h, g, d = self.head_shape
        xn = self.attn_norm(x)
        q = apply_rope(self.wq(xn).unflatten(-1, (h, d)), cos, sin)
        kv = self.wkv(xn).unflatten(-1, (2, g, d))  # contiguous: the Layer Block layout
        kv[..., 0, :, :] = apply_rope(kv[..., 0, :, :], cos, sin)
        return q, kv

    def finish(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """Residual after attention (attn [..., H*D]), then the SwiGLU MLP with its residual."""
        x = x + self.wo(attn)
        xn = self.mlp_norm(x)
        return x + (self.mlp(xn) if self.mlp_hook is None else self.mlp_hook(xn))

    def mlp(self, xn: torch.Tensor) -> torch.Tensor:
        """SwiGLU on normalised input xn [..., C] -> [..., C], all of it on this process (the
        product in place in silu's output: one [..., I] tensor written, not two)."""
        return self.w_down(F.silu(self.w_gate(xn)).mul_(self.w_up(xn)))


@dataclass(frozen=True, slots=True)
class PrefillItem:
    """One sequence in a prefill batch: `cached_tokens` positions whose K,V the caller supplies,
    followed by `token_ids`, the new tokens computed now (at least one)."""

    cached_tokens: int
    token_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.cached_tokens < 0 or not self.token_ids:
            raise ValueError(f"need cached_tokens >= 0 and at least one new token, got {self.cached_tokens}, "
                             f"{len(self.token_ids)}")


@dataclass(slots=True)
class PrefillState:
    """A prefill batch in flight. Mutable on purpose: `prefill_layer` replaces `hidden` and advances
    `next_layer`; layers must be run in order 0 .. num_layers - 1."""

    items: tuple[PrefillItem, ...]
    starts: tuple[int, ...]  # item i's new tokens are hidden[starts[i] : starts[i] + len(token_ids)]
    hidden: torch.Tensor  # [T, C]
    cos: torch.Tensor  # [T, D]
    sin: torch.Tensor  # [T, D]
    next_layer: int = 0


@dataclass(frozen=True, slots=True)
class PrefillResult:
    logits: torch.Tensor  # [N, V] last token of each item, float32
    new_kv: tuple[tuple[LayerKV, ...], ...]  # [layer][item]: K,V of the item's new tokens


def _as_item(item: PrefillItem | tuple[int, Sequence[int]]) -> PrefillItem:
    if isinstance(item, PrefillItem):
        return item
    cached, ids = item
    return PrefillItem(int(cached), tuple(ids.tolist() if isinstance(ids, torch.Tensor) else ids))


class Llama(nn.Module):
    def __init__(
        self, config: LlamaConfig, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> None:
        """Parameters are left uninitialised (the loaders fill every one of them)."""
        super().__init__()
        self.config = config
        with torch.device("meta"):  # no time spent on a random init that the weights overwrite
            self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
            self.blocks = nn.ModuleList(Block(config) for _ in range(config.num_layers))
            self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
            self.lm_head = (
                None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
            )
        self.to(dtype).to_empty(device=device)
        self.register_buffer("inv_freq", rope_inv_freq(config).to(device), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype, which is also the dtype of the K,V this model produces."""
        return self.embed.weight.dtype

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.embed.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(self.norm(x), weight).float()

    def _token_tensor(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=self.device)
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(f"token ids must be in [0, {self.config.vocab_size})")
        return ids

    # ---- 1. full recompute -------------------------------------------------------------------

    @torch.no_grad()
    def forward(self, token_ids: Sequence[int] | torch.Tensor) -> torch.Tensor:
        """Logits of every position, float32: token_ids [T] -> [T, V], or [B, T] -> [B, T, V]."""
        ids = self._token_tensor(token_ids)
        squeeze = ids.ndim == 1
        ids = ids[None] if squeeze else ids
        b, t = ids.shape
        x = self.embed(ids)  # [B, T, C]
        cos, sin = rope_cos_sin(self.inv_freq, torch.arange(t, device=self.device), self.dtype)  # [T, D]
        for block in self.blocks:
            q, kv = block.qkv(x, cos, sin)  # [B, T, H, D], [B, T, 2, G, D]
            r = self.config.num_query_groups
            k, v = (kv[:, :, i].transpose(1, 2).repeat_interleave(r, dim=1) for i in (0, 1))  # [B, H, T, D]
            attn = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, is_causal=True)  # [B, H, T, D]
            x = block.finish(x, attn.transpose(1, 2).flatten(2))
        logits = self._logits(x)
        return logits[0] if squeeze else logits

    # ---- 2. layerwise prefill ----------------------------------------------------------------

    @torch.no_grad()
    def begin_prefill(self, items: Sequence[PrefillItem | tuple[int, Sequence[int]]]) -> PrefillState:
        """Start a prefill batch; items are (cached_tokens, new token ids)."""
        items = tuple(_as_item(i) for i in items)
        if not items:
            raise ValueError("a prefill batch needs at least one item")
        lengths = [len(i.token_ids) for i in items]
        starts = tuple(itertools.accumulate(lengths[:-1], initial=0))
        ids = self._token_tensor(torch.cat([torch.tensor(i.token_ids, dtype=torch.long) for i in items]))  # [T]
        positions = torch.cat(
            [torch.arange(i.cached_tokens, i.cached_tokens + n) for i, n in zip(items, lengths)]
        ).to(self.device)  # [T]
        cos, sin = rope_cos_sin(self.inv_freq, positions, self.dtype)
        return PrefillState(items, starts, self.embed(ids), cos, sin)

    @torch.no_grad()
    def prefill_layer(self, state: PrefillState, layer: int, cached_kv: Sequence[LayerKV | None]) -> list[LayerKV]:
        """Run one layer. `cached_kv[i]` holds this layer's K,V of item i's cached tokens
        ([cached_tokens, 2, G, D]; None when it has none); returns the K,V of each item's new tokens
        (views into one [T, 2, G, D] tensor of this layer)."""
        if layer != state.next_layer:
            raise ValueError(f"prefill layers run in order: expected layer {state.next_layer}, got {layer}")
        if len(cached_kv) != len(state.items):
            raise ValueError(f"need cached K,V for {len(state.items)} items, got {len(cached_kv)}")
        block = self.blocks[layer]
        q, kv = block.qkv(state.hidden, state.cos, state.sin)  # [T, H, D], [T, 2, G, D]
        attn = torch.empty_like(q)
        new_kv = []
        for item, start, cached in zip(state.items, state.starts, cached_kv):
            span = slice(start, start + len(item.token_ids))
            new_kv.append(LayerKV(kv[span]))
            attn[span] = self._attend_item(q[span], self._item_keys(item, cached, kv[span]), item.cached_tokens)
        state.hidden = block.finish(state.hidden, attn.flatten(1))
        state.next_layer += 1
        return new_kv

    def _item_keys(self, item: PrefillItem, cached: LayerKV | None, kv_new: torch.Tensor) -> torch.Tensor:
        """K,V of an item's cached then new tokens: [cached + new, 2, G, D]."""
        num_cached = 0 if cached is None else cached.num_tokens
        if num_cached != item.cached_tokens:
            raise ValueError(f"item has {item.cached_tokens} cached tokens but {num_cached} were given")
        if cached is None or num_cached == 0:
            return kv_new
        if tuple(cached.kv.shape[1:]) != tuple(kv_new.shape[1:]):
            raise ValueError(f"cached K,V shape {tuple(cached.kv.shape)} does not match {tuple(kv_new.shape)}")
        cached_kv = cached.kv.to(self.device, self.dtype, non_blocking=cached.kv.is_pinned())
        return torch.cat((cached_kv, kv_new))

    @staticmethod
    def _attend_item(q: torch.Tensor, kv: torch.Tensor, num_cached: int) -> torch.Tensor:
        """q [n, H, D] over kv [num_cached + n, 2, G, D]; query i sits at position num_cached + i."""
        s = kv.shape[0]
        if num_cached == 0:
            mask, causal = None, True
        else:  # bottom-right aligned causal mask: key j visible to query i iff j <= num_cached + i
            pos_q = torch.arange(num_cached, s, device=q.device)
            mask, causal = torch.arange(s, device=q.device)[None, :] <= pos_q[:, None], False  # [n, S]
        # grouped-query attention in the kernel (enable_gqa): the same values as K,V heads repeated
        # for their query heads, without the copy, and 0.8-0.9 of its time on CPU (torch 2.13, a
        # 1K-token prompt: `dualpath bench model-speed --profile`)
        k, v = (kv[:, i].transpose(0, 1) for i in (0, 1))  # [G, S, D]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k[None], v[None], attn_mask=mask, is_causal=causal, enable_gqa=True
        )  # [1, H, n, D]
        return out[0].transpose(0, 1)  # [n, H, D]

    @torch.no_grad()
    def finish_prefill(self, state: PrefillState) -> torch.Tensor:
        """Logits of each item's last token: [N, V], float32."""
        if state.next_layer != self.config.num_layers:
            raise ValueError(f"finish_prefill after {state.next_layer} of {self.config.num_layers} layers")
        ends = [start + len(item.token_ids) for item, start in zip(state.items, state.starts)]
        last = torch.tensor(ends, device=self.device) - 1
        return self._logits(state.hidden[last])

    def prefill(
        self,
        items: Sequence[PrefillItem | tuple[int, Sequence[int]]],
        cached_kv: Sequence[Sequence[LayerKV | None]] | None = None,
    ) -> PrefillResult:
        """All layers of a layerwise prefill in one call; `cached_kv[layer][item]` as in `prefill_layer`."""
        state = self.begin_prefill(items)
        new_kv = []
        for layer in range(self.config.num_layers):
            cached = [None] * len(state.items) if cached_kv is None else cached_kv[layer]
            new_kv.append(tuple(self.prefill_layer(state, layer, cached)))
        return PrefillResult(self.finish_prefill(state), tuple(new_kv))

    # ---- 3. paged decode ---------------------------------------------------------------------

    @torch.no_grad()
    def decode_step(
        self, cache: PagedKVCache, seq_ids: Sequence[int], last_token_ids: Sequence[int] | torch.Tensor,
        after_layer: Callable[[int], None] | None = None,
    ) -> torch.Tensor:
        """One token for each of B sequences: appends its K,V to `cache`, returns logits [B, V] (float32).
        `after_layer(l)` runs once layer l is done (the engine serves its mail there, engine/mid_step.py)."""
        ids = self._token_tensor(last_token_ids)  # [B]
        if ids.shape != (len(seq_ids),):
            raise ValueError(f"need one last token per sequence: {len(seq_ids)} sequences, ids {tuple(ids.shape)}")
        batch = cache.prepare_decode(seq_ids)
        h, g, d = self.blocks[0].head_shape
        b = len(seq_ids)
        x = self.embed(ids)  # [B, C]
        cos, sin = rope_cos_sin(self.inv_freq, batch.positions, self.dtype)  # [B, D]
        for layer, block in enumerate(self.blocks):
            q, kv_new = block.qkv(x, cos, sin)  # [B, H, D], [B, 2, G, D]
            cache.write_decode(batch, layer, kv_new)
            attn = cache.attend(batch, layer, q.view(b, g, h // g, d))  # [B, G, R, D]
            x = block.finish(x, attn.reshape(b, h * d))
            if after_layer is not None:
                after_layer(layer)
        return self._logits(x)
