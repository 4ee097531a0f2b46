"""Shared fixtures for the block-store tests: a tiny layout, chains of digests, random payloads."""

from __future__ import annotations

import os

import numpy as np

from dualpath.core.blocks import BlockLayout, chain_digests
from dualpath.runtime.store import BlockStore
from dualpath.runtime.store.files import block_path

LAYOUT = BlockLayout(num_layers=2, block_tokens=4, kv_bytes_per_token_per_layer=512)  # 4 KiB blocks
FINGERPRINT = "ab" * 32
DTYPE = "bfloat16"
FILE_BYTES = 4096 + LAYOUT.full_block_bytes


def chain(num_blocks: int, seed: int = 0, layout: BlockLayout = LAYOUT) -> list[bytes]:
    tokens = np.random.default_rng(seed).integers(0, 50_000, num_blocks * layout.block_tokens)
    return chain_digests([int(t) for t in tokens], layout.block_tokens)


def payloads(num_blocks: int, seed: int = 0, layout: BlockLayout = LAYOUT) -> list[bytes]:
    rng = np.random.default_rng(seed + 1_000)
    return [rng.bytes(layout.full_block_bytes) for _ in range(num_blocks)]


def open_store(root, **kwargs) -> BlockStore:
    args = dict(layout=LAYOUT, fingerprint=FINGERPRINT, dtype=DTYPE, num_threads=2)
    args.update(kwargs)
    return BlockStore(root, **args)


def path_of(store: BlockStore, digest: bytes) -> str:
    return block_path(store.root, digest)


def flip_byte(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x5A]))


def files_under(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns)


def write_half_and_stall(fd, header, view) -> None:
    """A writer dying mid-put (the crash tests' children): the header and half the payload reach
    the temp file, then "HALF" on stdout and a wait for SIGKILL."""
    import os
    import time

    os.write(fd, header)
    os.write(fd, view[: len(view) // 2])
    print("HALF", flush=True)
    time.sleep(120)

