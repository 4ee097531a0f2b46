"""Get throughput of the storage service against the local store on the same disk
(`dualpath bench store --service`).

Both stores hold the same blocks under one work directory (one disk). The service runs as a
separate process (`dualpath store serve` on loopback), so its sends do not share this process's
interpreter lock with the client's receives, as on a real storage host. Each round reads every
block once from each store, alternating which goes first, in two cache states: `cold` drops the
store's files from the page cache before each read (the comparison that counts: both read the disk),
`warm` reads from the page cache (the service's own overhead: loopback TCP, the client's copy
and CRC32). Both readers verify every block's CRC32. Rates are payload bytes per second (1 GB =
1e9 bytes), best of the rounds. Acceptance target: service >= 0.8 x local, cold.
"""

from __future__ import annotations

import glob
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from dualpath.bench.store import _drop_cache, _timed
from dualpath.core.blocks import BlockLayout, chain_digests
from dualpath.runtime.store import files
from dualpath.runtime.store.remote import RemoteStore, store_for
from dualpath.runtime.store.store import BlockStore

TARGET_RATIO = 0.8  # project target: service get throughput >= 0.8 x the local store's (the network costs <= 20%)
_FINGERPRINT = "bench-service-" + "0" * 50
_GB = 1e9
_PUT_BATCH_BLOCKS = 16  # blocks per put request while filling the service


def run_service_bench(directory: str | os.PathLike[str], total_bytes: int, layout: BlockLayout,
                      num_threads: int, *, rounds: int = 3, seed: int = 0) -> dict:
    if total_bytes <= 0 or rounds < 1 or num_threads < 1:
        raise ValueError("need total_bytes > 0, rounds >= 1, num_threads >= 1")
    os.makedirs(directory, exist_ok=True)
    work = tempfile.mkdtemp(prefix="dualpath-service-bench-", dir=directory)
    proc = subprocess.Popen([sys.executable, "-m", "dualpath.cli", "store", "serve", "--dir", os.path.join(work, "svc"),
                             "--listen", "127.0.0.1:0", "--threads", str(num_threads)],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("listening on "):
            raise RuntimeError(f"the storage service did not start: {line!r}")
        url = line.split()[-1]
        return _run(work, url, total_bytes, layout, num_threads, rounds, seed)
    finally:
        proc.terminate()
        proc.wait(30)
        shutil.rmtree(work, ignore_errors=True)


def _run(work: str, url: str, total_bytes: int, layout: BlockLayout, num_threads: int, rounds: int, seed: int) -> dict:
    num_blocks = math.ceil(total_bytes / layout.full_block_bytes)
    payload_bytes = num_blocks * layout.full_block_bytes
    digests = chain_digests(list(range(num_blocks * layout.block_tokens)), layout.block_tokens)
    out = memoryview(files.aligned_buffer(payload_bytes))
    np.frombuffer(out, dtype=np.uint8).fill(1)  # fault the pages in now, not in the first timing
    local = BlockStore(os.path.join(work, "local"), layout, _FINGERPRINT, "uint8", num_threads=num_threads)
    remote = store_for(url, layout, _FINGERPRINT, "uint8")
    assert isinstance(remote, RemoteStore)
    try:
        _fill(local, remote, digests, layout, seed)
        local_files = [files.block_path(local.root, d) for d in digests]
        service_files = glob.glob(os.path.join(work, "svc", "*", "*", "*" + files.BLOCK_SUFFIX))
        times: dict[str, dict[str, list[float]]] = {c: {"local": [], "service": []} for c in ("cold", "warm")}
        for cache in ("cold", "warm"):
            for r in range(rounds):
                order = [("local", local, local_files), ("service", remote, service_files)]
                for name, store, paths in order if r % 2 == 0 else order[::-1]:
                    if cache == "cold":
                        _drop_cache(paths)
                    times[cache][name].append(_timed(lambda: _read(store, digests, out)))
        checksum_failures = remote.stats().checksum_failures
    finally:
        local.close()
        remote.close()
    result: dict = {"num_blocks": num_blocks, "full_block_bytes": layout.full_block_bytes,
                    "payload_bytes": payload_bytes, "num_threads": num_threads, "rounds": rounds,
                    "service_checksum_failures": checksum_failures, "target_ratio": TARGET_RATIO}
    for cache, by_store in times.items():
        local_gbps = payload_bytes / min(by_store["local"]) / _GB
        service_gbps = payload_bytes / min(by_store["service"]) / _GB
        result[cache] = {"local_read_gbps": local_gbps, "service_read_gbps": service_gbps,
                         "ratio": service_gbps / local_gbps, "local_read_s": by_store["local"],
                         "service_read_s": by_store["service"]}
    result["ratio"] = result["cold"]["ratio"]
    result["meets_target"] = result["ratio"] >= TARGET_RATIO
    return result


def _fill(local: BlockStore, remote: RemoteStore, digests: list[bytes], layout: BlockLayout, seed: int) -> None:
    base = np.random.default_rng(seed).integers(0, 256, layout.full_block_bytes, dtype=np.uint8)
    batch: list[tuple[bytes, bytes]] = []
    for i, digest in enumerate(digests):
        block = base.copy()
        block[:8] = np.frombuffer(i.to_bytes(8, "little"), dtype=np.uint8)
        local.put(digest, block)
        batch.append((digest, block.tobytes()))
        if len(batch) == _PUT_BATCH_BLOCKS or i == len(digests) - 1:
            remote.put_many(batch)
            batch = []


def _read(store: BlockStore | RemoteStore, digests: list[bytes], out: memoryview) -> None:
    got = store.read_into(digests, out)
    if got != len(digests):
        raise RuntimeError(f"{type(store).__name__} returned {got} of {len(digests)} blocks")
