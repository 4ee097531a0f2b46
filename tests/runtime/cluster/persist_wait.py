"""Wait, with a deadline, until the decode engine's persist writes of a turn are in the store.

Persisting runs behind the SNIC write queue of an engine process, so a fixed sleep between turns is
a guess that a loaded machine can lose; these poll what the next turn's lookup will see."""

import asyncio
import os
import time

from dualpath.core.blocks import chain_digests
from dualpath.runtime.store import BlockStore
from dualpath.runtime.store.files import BLOCK_SUFFIX

DEADLINE_S = 60.0  # generous: a turn's few blocks are written in milliseconds on an idle machine
POLL_S = 0.02


async def wait_chain_stored(store: BlockStore, tokens: list[int], block_tokens: int) -> int:
    """Poll `store.lookup` until every full block of `tokens` is stored; returns the count seen
    (fewer only when the deadline passed: the caller's own assertion then says what is missing)."""
    digests = chain_digests(tokens, block_tokens)
    deadline = time.monotonic() + DEADLINE_S
    while (n := store.lookup(digests)) < len(digests) and time.monotonic() < deadline:
        await asyncio.sleep(POLL_S)
    return n


def wait_block_files(root: str, min_blocks: int) -> int:
    """Poll the store directory until it holds at least `min_blocks` whole block files."""
    deadline = time.monotonic() + DEADLINE_S
    while (n := count_block_files(root)) < min_blocks and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return n


def count_block_files(root: str) -> int:
    return sum(name.endswith(BLOCK_SUFFIX) for _, _, names in os.walk(root) for name in names)
