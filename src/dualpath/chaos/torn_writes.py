"""`dualpath chaos --torn-writes N`: a writer killed with SIGKILL mid-put leaves no torn block visible.

Each of N trials, on one store directory that accumulates every trial's blocks:
  1. a forked child opens the store, puts `WHOLE_BLOCKS` blocks of its own chain (these must
     survive), then starts one more put and stops inside it at a seeded byte of header + payload
     (any byte, or every byte written and the rename not yet done) and says so on a pipe;
  2. the parent kills it with SIGKILL there and reopens the store, as a restarted server would;
  3. the reopened store must show exactly the whole blocks: the trial's chain reads back (header
     and CRC32 checked) with the bytes that were put, the killed put's block is absent, and no
     temp file is left (a dead writer's temp files are removed at open, store/files.py).
A torn block visible is a trial where the killed block is visible, a whole block is missing or
reads back other bytes, or a temp file survives the reopen. At the end one more reopen checks
every whole block of every trial again.
"""

from __future__ import annotations

import os
import random
import select
import signal
import tempfile
import shutil
import time
from dataclasses import dataclass

from ..core.blocks import BlockLayout, chain_digests
from ..runtime.store import BlockStore
from ..runtime.store.files import TEMP_MARK

LAYOUT = BlockLayout(num_layers=4, block_tokens=64, kv_bytes_per_token_per_layer=256)  # the tiny model's, float32
FINGERPRINT = "torn-writes"
DTYPE = "float32"
WHOLE_BLOCKS = 2
HEADER_BYTES = 4096  # store/format.py
ALL_WRITTEN_EVERY = 10  # the other trials stop at a uniform byte of the file (about 6% in its header)
STALL_TIMEOUT_S = 30.0  # the child reaches its stall point in milliseconds; generous for a loaded host


class _StallingStore(BlockStore):
    """A store whose next put writes the first `cut` bytes of its file, signals `notify_fd` and
    waits to be killed (the seam store.py keeps for crash tests)."""

    cut = -1
    notify_fd = -1

    def _write_payload(self, fd: int, header: bytes, view: memoryview) -> None:
        if self.cut < 0:
            return super()._write_payload(fd, header, view)
        data = bytes(header) + bytes(view)
        os.write(fd, data[: self.cut])
        os.write(self.notify_fd, b"S")
        time.sleep(STALL_TIMEOUT_S * 4)


@dataclass(frozen=True, slots=True)
class Trial:
    chain: list[bytes]
    payloads: list[bytes]
    cut: int


def _trial(index: int, seed: int) -> Trial:
    rng = random.Random(f"torn:{seed}:{index}")
    tokens = [rng.randrange(50_000) for _ in range((WHOLE_BLOCKS + 1) * LAYOUT.block_tokens)]
    payloads = [rng.randbytes(LAYOUT.full_block_bytes) for _ in range(WHOLE_BLOCKS + 1)]
    total = HEADER_BYTES + LAYOUT.full_block_bytes
    # one trial in ALL_WRITTEN_EVERY stops with every byte written, just before the rename
    cut = total if index % ALL_WRITTEN_EVERY == ALL_WRITTEN_EVERY - 1 else rng.randrange(total)
    return Trial(chain_digests(tokens, LAYOUT.block_tokens), payloads, cut)


def _kill_mid_put(root: str, t: Trial) -> int:
    """Fork the writer, kill it at its stall point; its wait status."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(r)
            store = _StallingStore(root, LAYOUT, FINGERPRINT, DTYPE, num_threads=1)
            for d, p in zip(t.chain[:WHOLE_BLOCKS], t.payloads):
                store.put(d, p)
            store.cut, store.notify_fd = t.cut, w
            store.put(t.chain[WHOLE_BLOCKS], t.payloads[WHOLE_BLOCKS])
        finally:
            os._exit(3)
    os.close(w)
    try:
        ready, _, _ = select.select([r], [], [], STALL_TIMEOUT_S)
        if not ready or os.read(r, 1) != b"S":
            raise RuntimeError(f"writer {pid} never reached its stall point")
    finally:
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        os.close(r)
    return status


def _torn_after_reopen(root: str, trials: list[Trial], check_killed: bool) -> int:
    """Reopen the store; count the trials whose blocks are not exactly the whole ones."""
    torn = 0
    with BlockStore(root, LAYOUT, FINGERPRINT, DTYPE, num_threads=1) as store:
        temps = any(TEMP_MARK in n for _, _, ns in os.walk(root) for n in ns)
        for t in trials:
            out = bytearray(WHOLE_BLOCKS * LAYOUT.full_block_bytes)
            whole = store.read_into(t.chain[:WHOLE_BLOCKS], out) == WHOLE_BLOCKS and bytes(out) == b"".join(t.payloads[:WHOLE_BLOCKS])
            killed_visible = check_killed and store.lookup(t.chain) > WHOLE_BLOCKS
            torn += (not whole) or killed_visible
    return torn + temps


def run_torn_writes(num_kills: int, seed: int = 0) -> dict:
    root = tempfile.mkdtemp(prefix="dp-torn-")
    trials: list[Trial] = []
    torn_per_kill = 0
    killed = 0
    t0 = time.monotonic()
    try:
        for i in range(num_kills):
            t = _trial(i, seed)
            status = _kill_mid_put(root, t)
            killed += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            trials.append(t)
            torn_per_kill += _torn_after_reopen(root, [t], check_killed=True)
        torn_final = _torn_after_reopen(root, trials, check_killed=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    cuts = [t.cut for t in trials]
    return {"kills": num_kills, "killed_by_sigkill": int(killed), "torn_visible_after_each_restart": torn_per_kill,
            "torn_visible_at_final_restart": torn_final, "whole_blocks_checked": WHOLE_BLOCKS * num_kills,
            "stall_points": {"in_header": sum(c < HEADER_BYTES for c in cuts),
                             "in_payload": sum(HEADER_BYTES <= c < HEADER_BYTES + LAYOUT.full_block_bytes for c in cuts),
                             "all_written_not_renamed": sum(c == HEADER_BYTES + LAYOUT.full_block_bytes for c in cuts)},
            "seconds": time.monotonic() - t0, "block_bytes": LAYOUT.full_block_bytes, "seed": seed}
