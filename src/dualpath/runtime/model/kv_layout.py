"""One layer's K and V in the Layer Block byte layout (docs/paper.md §1.5, core/blocks.py).

Per token and layer the bytes are [2 (K then V), num_kv_heads, head_dim] elements of the KV
dtype, so n tokens of one layer are one contiguous [n, 2, num_kv_heads, head_dim] array and a
Full Block is num_layers such arrays of block_tokens tokens, back to back (`BlockLayout`).

The model's fused K/V projection writes exactly this layout, so turning a layer's KV into bytes
is a view on the host, and turning bytes back into a `LayerKV` is a view too (torch.frombuffer).
Copies happen only where the data must move or change: to another device or dtype, or when
several Full Blocks are gathered into one layer's run of tokens.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

import torch

from dualpath.runtime.model.config import LlamaConfig

KV_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

Buffer = bytes | bytearray | memoryview


def kv_dtype_from_name(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name not in KV_DTYPES.values():
            raise ValueError(f"KV dtype {name} not supported; use one of {sorted(KV_DTYPES)}")
        return name
    try:
        return KV_DTYPES[name.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"KV dtype {name!r} not supported; use one of {sorted(KV_DTYPES)}") from None


@dataclass(frozen=True, slots=True)
class LayerKV:
    """K and V of one layer for a run of tokens; `kv[t, 0]` is token t's K, `kv[t, 1]` its V."""

    kv: torch.Tensor  # [tokens, 2, num_kv_heads, head_dim]

    def __post_init__(self) -> None:
        if self.kv.ndim != 4 or self.kv.shape[1] != 2:
            raise ValueError(f"LayerKV needs [tokens, 2, num_kv_heads, head_dim], got {tuple(self.kv.shape)}")

    @classmethod
    def from_kv(cls, k: torch.Tensor, v: torch.Tensor) -> "LayerKV":
        """From separate K and V, each [tokens, num_kv_heads, head_dim] (one copy)."""
        return cls(torch.stack((k, v), dim=1))

    @property
    def num_tokens(self) -> int:
        return self.kv.shape[0]

    @property
    def k(self) -> torch.Tensor:
        return self.kv[:, 0]  # [tokens, num_kv_heads, head_dim], a view

    @property
    def v(self) -> torch.Tensor:
        return self.kv[:, 1]

    def slice_tokens(self, start: int, stop: int) -> "LayerKV":
        """Tokens [start, stop) (half-open), a view."""
        return LayerKV(self.kv[start:stop])


def layer_kv_to_bytes(
    layer_kv: LayerKV, dtype: torch.dtype | None = None, out: torch.Tensor | None = None
) -> memoryview:
    """Host bytes of `layer_kv` in the Layer Block layout.

    Zero-copy when the KV is already a contiguous CPU tensor of `dtype` and no `out` is given;
    otherwise one copy, into `out` when given (a uint8 host buffer, e.g. pinned, of exactly the
    right size). A returned view aliases the tensor: it stays valid while the tensor lives.
    """
    dtype = layer_kv.kv.dtype if dtype is None else dtype
    src = layer_kv.kv.to(dtype=dtype)
    if out is None:
        host = src.cpu().contiguous()
        return memoryview(host.reshape(-1).view(torch.uint8).numpy())
    nbytes = src.numel() * dtype.itemsize
    if out.dtype != torch.uint8 or out.device.type != "cpu" or out.numel() != nbytes or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous uint8 host tensor of {nbytes} bytes")
    out.view(dtype).view(src.shape).copy_(src, non_blocking=out.is_pinned())
    if out.is_pinned() and src.is_cuda:
        torch.cuda.current_stream(src.device).synchronize()
    return memoryview(out.numpy())


def layer_kv_from_bytes(
    buf: Buffer | torch.Tensor, config: LlamaConfig, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> LayerKV:
    """A `LayerKV` over Layer Block bytes of any whole number of tokens.

    On the CPU in the same dtype this is a view of `buf` (no copy): do not write to it when `buf`
    is read-only. For another device the bytes are copied once (asynchronously from pinned memory).
    """
    per_token_bytes = config.kv_bytes_per_token_per_layer(dtype)
    if isinstance(buf, torch.Tensor):
        flat = buf.reshape(-1).view(torch.uint8)
    else:
        with warnings.catch_warnings():  # read-only buffers are fine: we never write through this view
            warnings.simplefilter("ignore", UserWarning)
            empty = len(memoryview(buf)) == 0  # frombuffer refuses empty buffers
            flat = torch.empty(0, dtype=torch.uint8) if empty else torch.frombuffer(buf, dtype=torch.uint8)
    if flat.numel() % per_token_bytes:
        raise ValueError(f"{flat.numel()} bytes is not a whole number of {per_token_bytes}-byte tokens")
    kv = flat.view(dtype).view(-1, 2, config.num_kv_heads, config.head_dim)
    if torch.device(device) != kv.device:
        kv = kv.to(device, non_blocking=kv.is_pinned())
    return LayerKV(kv)


def host_kv_buffer(config: LlamaConfig, num_tokens: int, dtype: torch.dtype, pin_memory: bool = False) -> torch.Tensor:
    """An uninitialised uint8 host buffer for `num_tokens` tokens of one layer (pinned on request,
    for asynchronous copies to and from a GPU)."""
    nbytes = num_tokens * config.kv_bytes_per_token_per_layer(dtype)
    return torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin_memory)


def layer_kv_from_full_blocks(
    full_blocks: Sequence[Buffer | torch.Tensor],
    layer: int,
    config: LlamaConfig,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
) -> LayerKV:
    """Layer `layer` of consecutive Full Blocks (a stored prefix) as one run of tokens.

    The Layer Blocks of one layer are not adjacent across Full Blocks, so more than one block
    costs one gather copy; a single block on the host is a view.
    """
    if not 0 <= layer < config.num_layers:
        raise IndexError(f"layer {layer} outside [0, {config.num_layers})")
    per_token_bytes = config.num_layers * config.kv_bytes_per_token_per_layer(dtype)
    parts = []
    for block in full_blocks:
        is_tensor = isinstance(block, torch.Tensor)
        mv = memoryview(block.reshape(-1).view(torch.uint8).numpy()) if is_tensor else memoryview(block)
        if len(mv) % per_token_bytes:
            raise ValueError(f"a Full Block of {len(mv)} bytes is not a whole number of {per_token_bytes}-byte tokens")
        layer_bytes = len(mv) // config.num_layers  # one Layer Block
        parts.append(layer_kv_from_bytes(mv[layer * layer_bytes : (layer + 1) * layer_bytes], config, dtype).kv)
    if not parts:
        return LayerKV(torch.empty(0, 2, config.num_kv_heads, config.head_dim, dtype=dtype, device=device))
    kv = parts[0] if len(parts) == 1 else torch.cat(parts)
    return LayerKV(kv.to(device))


def full_blocks_from_layer_kvs(
    layer_kvs: Sequence[LayerKV], block_tokens: int, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Full Blocks of a prompt from its per-layer KV: uint8 host tensor [num_blocks, full_block_bytes].

    Only whole blocks are returned; a trailing partial block is left out (core/blocks.py).
    One copy (the layer-major KV is transposed to block-major order).
    """
    if not layer_kvs:
        raise ValueError("need the KV of at least one layer")
    num_blocks = layer_kvs[0].num_tokens // block_tokens
    num_tokens = num_blocks * block_tokens
    if any(lkv.num_tokens != layer_kvs[0].num_tokens for lkv in layer_kvs):
        raise ValueError("every layer must hold the same number of tokens")
    dtype = layer_kvs[0].kv.dtype if dtype is None else dtype
    if num_blocks == 0:
        full_block_bytes = len(layer_kvs) * block_tokens * layer_kvs[0].kv[0].numel() * dtype.itemsize
        return torch.empty(0, full_block_bytes, dtype=torch.uint8)
    stacked = torch.stack([lkv.kv[:num_tokens] for lkv in layer_kvs])  # [layers, tokens, 2, kvh, hd]
    per_block = stacked.unflatten(1, (num_blocks, block_tokens)).transpose(0, 1)  # [blocks, layers, bt, 2, kvh, hd]
    host = per_block.to(device="cpu", dtype=dtype).contiguous()
    return host.reshape(num_blocks, -1).view(torch.uint8)
