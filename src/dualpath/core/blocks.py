"""Prefix blocks: chained hashing and the Layer Block / Full Block layout.

A sequence is cut into blocks of `block_tokens` tokens (64 by default, docs/paper.md §1.5).
Block k covers tokens [k * block_tokens, (k + 1) * block_tokens) (half-open). Only full
blocks are hashed, stored and reused; a trailing partial block is always recomputed.

Block id k = SHA-256(parent_digest || token ids as 4-byte little-endian), where the parent of
block 0 is `ROOT_DIGEST`. Equal ids therefore mean equal token prefixes (up to SHA-256
collisions), which is what makes a stored block reusable by any request with that prefix.
A request's `cache_salt` (a tenant, say) gives block 0 another parent (`salted_root`), and so
every key of its chain: prompts under different salts never share a stored block, so no tenant
can tell from a hit's speed what another sent (vLLM and SGLang salt their prefix hashes alike).

Traces that only carry opaque block ids (Mooncake `hash_ids`) use `OpaqueBlockId`: the chain is
implied by the trace itself, so ids are taken as given.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Iterable, Sequence

BLOCK_TOKENS_DEFAULT = 64  # docs/paper.md §1.5: "e.g., 64 tokens" (decode persist granularity)
ROOT_DIGEST = b"\x00" * 32
_MAX_TOKEN_ID = 2**32 - 1


def block_digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    """SHA-256 over the parent digest and the block's token ids (uint32 little-endian)."""
    if len(parent) != 32:
        raise ValueError(f"parent digest must be 32 bytes, got {len(parent)}")
    for t in tokens:
        if not 0 <= t <= _MAX_TOKEN_ID:
            raise ValueError(f"token id {t} does not fit in 4 bytes")
    h = hashlib.sha256(parent)
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return h.digest()


def salted_root(salt: str) -> bytes:
    """The parent of block 0 for a request with `cache_salt` `salt` ("": none, `ROOT_DIGEST`)."""
    if not salt:
        return ROOT_DIGEST
    return hashlib.sha256(b"dualpath cache_salt\x00" + salt.encode()).digest()


def chain_digests(tokens: Sequence[int], block_tokens: int = BLOCK_TOKENS_DEFAULT,
                  root: bytes = ROOT_DIGEST) -> list[bytes]:
    """Digests of every full block of `tokens`, in order, block 0's parent `root`; the trailing
    partial block is skipped."""
    if block_tokens <= 0:
        raise ValueError("block_tokens must be positive")
    digests: list[bytes] = []
    parent = root
    for start in range(0, len(tokens) - block_tokens + 1, block_tokens):
        parent = block_digest(parent, tokens[start : start + block_tokens])
        digests.append(parent)
    return digests


def num_full_blocks(num_tokens: int, block_tokens: int = BLOCK_TOKENS_DEFAULT) -> int:
    return num_tokens // block_tokens


def longest_stored_prefix(digests: Sequence[bytes], stored: "set[bytes] | frozenset[bytes]") -> int:
    """Number of leading blocks present in `stored` (a chain: block k needs blocks < k)."""
    n = 0
    for d in digests:
        if d not in stored:
            break
        n += 1
    return n


@dataclass(frozen=True, slots=True)
class OpaqueBlockId:
    """A block id taken from a trace (e.g. Mooncake `hash_ids`); its prefix chain is implicit."""

    value: int


@dataclass(frozen=True, slots=True)
class BlockLayout:
    """Byte layout of KV blocks (docs/paper.md §1.5).

    Layer Block = [1, block_tokens, bytes_per_token_per_layer] bytes; Full Block =
    [num_layers, block_tokens, bytes_per_token_per_layer]: num_layers Layer Blocks back to back,
    so layer l of a Full Block is the byte range [l * layer_block_bytes, (l + 1) * layer_block_bytes).
    """

    num_layers: int
    block_tokens: int
    kv_bytes_per_token_per_layer: int

    def __post_init__(self) -> None:
        if min(self.num_layers, self.block_tokens, self.kv_bytes_per_token_per_layer) <= 0:
            raise ValueError(f"BlockLayout fields must be positive: {self}")

    @property
    def layer_block_bytes(self) -> int:
        return self.block_tokens * self.kv_bytes_per_token_per_layer

    @property
    def full_block_bytes(self) -> int:
        return self.num_layers * self.layer_block_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.num_layers * self.kv_bytes_per_token_per_layer

    def layer_range(self, layer: int) -> tuple[int, int]:
        """Half-open byte range of `layer` inside one Full Block."""
        if not 0 <= layer < self.num_layers:
            raise IndexError(f"layer {layer} outside [0, {self.num_layers})")
        start = layer * self.layer_block_bytes
        return start, start + self.layer_block_bytes

    def token_range(self, layer: int, token: int) -> tuple[int, int]:
        """Half-open byte range of one token's KV for `layer` inside one Full Block."""
        if not 0 <= token < self.block_tokens:
            raise IndexError(f"token {token} outside [0, {self.block_tokens})")
        start = self.layer_range(layer)[0] + token * self.kv_bytes_per_token_per_layer
        return start, start + self.kv_bytes_per_token_per_layer

    def hit_bytes(self, num_blocks: int) -> int:
        return num_blocks * self.full_block_bytes


def split_full_block(layout: BlockLayout, full: bytes | memoryview) -> list[memoryview]:
    """Zero-copy views of the Layer Blocks inside one Full Block."""
    mv = memoryview(full)
    if len(mv) != layout.full_block_bytes:
        raise ValueError(f"full block has {len(mv)} bytes, expected {layout.full_block_bytes}")
    return [mv[slice(*layout.layer_range(l))] for l in range(layout.num_layers)]


def join_layer_blocks(layout: BlockLayout, layers: Iterable[bytes | memoryview]) -> bytes:
    parts = [bytes(p) for p in layers]
    if len(parts) != layout.num_layers or any(len(p) != layout.layer_block_bytes for p in parts):
        raise ValueError("need num_layers Layer Blocks of layer_block_bytes each")
    return b"".join(parts)
