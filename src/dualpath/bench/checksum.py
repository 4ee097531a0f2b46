"""`dualpath bench checksum`: which checksum is fastest over KV-block-sized buffers: stdlib
zlib.crc32, google-crc32c, crc32c and xxhash (xxh3_64, xxh64), each installed one.

Sizes are the runtime's checksummed units (transport/integrity.py checksums one Layer Block per
piece of a layer stream or PD transfer; the store one Full Block per file), float32 KV,
64-token blocks:
  tiny          4 layers, 2 KV heads x head_dim 16:  Layer Block 16 KiB, Full Block 64 KiB
  smollm2-135m 30 layers, 3 KV heads x head_dim 64:  Layer Block 96 KiB, Full Block 2.81 MiB

    dualpath bench checksum [--json F] [--seconds S]

Each (function, size) runs for --seconds on one thread over a ring of distinct buffers (64 MiB
in all, more than the last-level cache, as blocks arriving from a link are), best of 3 rounds.
"""

import os
import platform
import time
import zlib

import numpy as np

RING_BYTES = 64 * 2**20  # buffers cycled per size: larger than the LLC, so reads come from DRAM
SIZES = {  # name -> bytes (see the module docstring)
    "tiny_layer_block": 64 * 256,
    "tiny_full_block": 4 * 64 * 256,
    "smollm2_layer_block": 64 * 1536,
    "smollm2_full_block": 30 * 64 * 1536,
}


def candidates() -> dict:
    out = {"zlib.crc32": zlib.crc32}
    try:
        import google_crc32c

        out["google_crc32c.value"] = google_crc32c.value
    except ImportError:
        pass
    try:
        import crc32c

        out["crc32c.crc32c"] = crc32c.crc32c
    except ImportError:
        pass
    try:
        import xxhash

        out["xxhash.xxh3_64_intdigest"] = xxhash.xxh3_64_intdigest
        out["xxhash.xxh64_intdigest"] = xxhash.xxh64_intdigest
    except ImportError:
        pass
    return out


def gbps(fn, nbytes: int, seconds: float) -> float:
    count = max(1, RING_BYTES // nbytes)
    ring = np.random.default_rng(0).integers(0, 256, count * nbytes, dtype=np.uint8)
    bufs = [ring[i * nbytes:(i + 1) * nbytes] for i in range(count)]  # numpy views, as the runtime passes
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds / 3:
            for b in bufs[:64]:
                fn(b)
            n += min(64, count)
            bufs = bufs[64:] + bufs[:64]
        best = max(best, n * nbytes / elapsed / 1e9)
    return best


def run_checksum_bench(seconds: float) -> dict:
    """GB/s per (function, size), the function with the best worst-case ratio to the best, the machine."""
    fns = candidates()
    rows = {name: {size: gbps(fn, nb, seconds) for size, nb in SIZES.items()} for name, fn in fns.items()}
    winner = max(rows, key=lambda n: min(rows[n][s] / max(rows[m][s] for m in rows) for s in SIZES))
    return {"gbps": rows, "sizes_bytes": SIZES, "winner": winner, "seconds": seconds,
            "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "python": platform.python_version()}}
