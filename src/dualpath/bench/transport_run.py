"""`dualpath bench transport`: four KV transfers side by side, in one run of alternating rounds.

The transfers (transport.py, transport_paths.py): in-process memcpy (the reference), shared memory
between two engine processes, our remote writes over loopback TCP, and Mooncake Transfer Engine
over loopback TCP. The sizes are what the engines send for the model: one layer's slice of a block
(a Layer Block) and a whole block (a Full Block), from the model's shape and the runtime config's
`block_tokens` and `kv_dtype` (`model_layout`); `--block-mib` adds one more.

Each round, per size, every transfer in turn (the order rotated each round) moves `total_bytes` as
blocks issued at once (one throughput sample: GB/s), then up to `latency_blocks` blocks one at a time
(per-block latency samples). A transfer's ratio to memcpy is the median over rounds of its rate over
memcpy's rate in the same round. In the last round each destination is cleared first and its
checksum compared with the source's after the stream. Without Mooncake (the package or a system
library missing, or its engine not starting) its row is skipped with the reason, the others run.
Where Mooncake's time goes: per size, its own calls without the link, one synchronous write per
block against all blocks in one batch (`mooncake_breakdown`).

Rates named `*_gbps` are GB/s (1e9 bytes per second), as in `bench.store`.
"""

from __future__ import annotations

import contextlib
import os
import platform
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from ..config import RuntimeConfig
from ..core.blocks import BlockLayout
from ..errors import InputError
from ..runtime.transport.mooncake import engine_class
from .transport import REAL_SPEED_CHUNK_BYTES, ShmPath, source_bytes
from .transport_paths import MemcpyPath, MooncakePath, RemoteWritePath, TargetChild, TransferPath

LAYER_BLOCK, FULL_BLOCK, EXTRA_BLOCK = "layer block", "full block", "--block-mib"
# Latency samples per size per round: enough for a p90, few enough that a round stays short
LATENCY_BLOCKS_DEFAULT = 64


def model_layout(cfg: RuntimeConfig) -> BlockLayout:
    """The KV block layout the engines of `cfg` use (runtime/engine/base.py builds the same), from
    the model's shape alone: a built-in name or a .gguf file, its metadata read, no weights loaded."""
    from ..runtime.model.kv_layout import kv_dtype_from_name
    from ..runtime.model.loader import smollm2_gguf_path, tiny_config

    if cfg.model == "tiny":
        mcfg = tiny_config(cfg.seed)
    elif cfg.model == "smollm2-135m" or cfg.model.endswith(".gguf"):
        from gguf import GGUFReader

        from ..runtime.model.gguf_loader import config_from_metadata, read_metadata

        path = smollm2_gguf_path() if cfg.model == "smollm2-135m" else Path(cfg.model)
        if not path.is_file():
            raise InputError(f"GGUF file not found: {path}")
        reader = GGUFReader(path)
        mcfg = config_from_metadata(read_metadata(reader), {t.name for t in reader.tensors}, "", str(path))
    else:
        raise InputError(f"--model {cfg.model!r}: bench transport takes a built-in model (smollm2-135m, tiny) or a .gguf file")
    return mcfg.block_layout(kv_dtype_from_name(str(cfg.kv_dtype)), cfg.block_tokens)


def block_sizes(layout: BlockLayout, extra_bytes: int | None = None) -> dict[str, int]:
    """{size name: block bytes}: a layer's slice of a block, a whole block, and `extra_bytes` if given."""
    sizes = {LAYER_BLOCK: layout.layer_block_bytes, FULL_BLOCK: layout.full_block_bytes}
    if extra_bytes is not None:
        sizes[EXTRA_BLOCK] = extra_bytes
    return sizes


def _mooncake_missing() -> str | None:
    """Why Mooncake cannot run here (its InputError), or None when its binding loads."""
    try:
        engine_class()
    except InputError as exc:
        return str(exc)
    return None


def _open_paths(stack: contextlib.ExitStack, src: np.ndarray, chunk_bytes: int,
                engine_nt_threshold_bytes: int | None, skipped: dict[str, str]) -> list[Any]:
    """The four transfers (three when Mooncake is skipped, with its reason in `skipped`)."""
    total_bytes = src.nbytes
    missing = _mooncake_missing()
    memcpy = MemcpyPath(src)
    shm = stack.enter_context(ShmPath(total_bytes, chunk_bytes, engine_nt_threshold_bytes))
    if shm.source_crc != zlib.crc32(src):
        raise RuntimeError("the holder's bytes differ from this process's source bytes")
    target = TargetChild(total_bytes, with_mooncake=missing is None)
    stack.callback(target.close)
    tcp = RemoteWritePath(target, src, chunk_bytes)
    stack.callback(tcp.close)
    paths: list[Any] = [memcpy, shm, tcp]
    if missing is None and target.mooncake_error:
        missing = f"Mooncake Transfer Engine did not start in the target process: {target.mooncake_error}"
    if missing is None:
        try:
            mooncake = MooncakePath(target, src, chunk_bytes)
        except InputError as exc:
            missing = str(exc)
        else:
            stack.callback(mooncake.close)
            paths.append(mooncake)
    if missing is not None:
        skipped["mooncake"] = missing
    return paths


def _measure(path: TransferPath, b: int, n: int, latency_blocks: int, check_crc: int | None,
             cell: dict[str, Any]) -> None:
    """One round of one transfer at one size into `cell`; with `check_crc`, cleared first and checked."""
    if check_crc is not None:
        path.clear()
    cell["stream_s"].append(path.stream(b, n))
    if check_crc is not None:
        cell["intact"] = path.landed_crc(n * b) == check_crc
    cell["each_s"].extend(path.each(b, min(n, latency_blocks)))


def run_transport_bench(sizes: dict[str, int], total_bytes: int, rounds: int = 5,
                        chunk_bytes: int = REAL_SPEED_CHUNK_BYTES, latency_blocks: int = LATENCY_BLOCKS_DEFAULT,
                        engine_nt_threshold_bytes: int | None = None) -> dict[str, Any]:
    """Every transfer at every size in `rounds` alternating rounds (module doc); the summary dict.
    `engine_nt_threshold_bytes` lowers glibc's non-temporal threshold in the shared-memory engine
    processes (ShmPath), e.g. to `chunk_bytes`."""
    if rounds < 1 or latency_blocks < 1 or chunk_bytes < 1:
        raise InputError("rounds, latency blocks and chunk bytes must be >= 1")
    if not sizes or min(sizes.values()) < 1 or max(sizes.values()) > total_bytes:
        raise InputError(f"every block size must be positive and at most the total ({total_bytes} bytes)")
    src = source_bytes(total_bytes)
    crcs = {name: zlib.crc32(src[:total_bytes // b * b]) for name, b in sizes.items()}
    skipped: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        paths = _open_paths(stack, src, chunk_bytes, engine_nt_threshold_bytes, skipped)
        cells = {p.name: {s: {"stream_s": [], "each_s": [], "intact": False} for s in sizes} for p in paths}
        breakdown: dict[str, list[dict[str, float]]] = {s: [] for s in sizes}
        for r in range(rounds):
            order = paths[r % len(paths):] + paths[:r % len(paths)]
            for name, b in sizes.items():
                n = total_bytes // b
                for p in order:
                    _measure(p, b, n, latency_blocks, crcs[name] if r == rounds - 1 else None, cells[p.name][name])
                if isinstance(paths[-1], MooncakePath):
                    breakdown[name].append(paths[-1].breakdown(b, n))
    rows = {t: {s: _summary(c, sizes[s], total_bytes // sizes[s], cells["memcpy"][s]) for s, c in by_size.items()}
            for t, by_size in cells.items()}
    result = {"total_bytes": total_bytes, "rounds": rounds, "chunk_bytes": chunk_bytes, "latency_blocks": latency_blocks,
              "engine_nt_threshold_bytes": engine_nt_threshold_bytes, "sizes": sizes, "transfers": list(rows),
              "skipped": skipped, "rows": rows, "machine": platform.platform(), "cpus": os.cpu_count()}
    if "mooncake" in rows:
        result["mooncake_breakdown"] = _mooncake_breakdown(rows, breakdown, sizes, total_bytes)
    result["notes"] = _notes(result)
    return result


def _summary(cell: dict[str, Any], b: int, n: int, memcpy: dict[str, Any]) -> dict[str, Any]:
    """A transfer at one size: rates over rounds, latency percentiles, the ratio to memcpy."""
    gbps = [n * b / s / 1e9 for s in cell["stream_s"]]
    ratios = [m / s for s, m in zip(cell["stream_s"], memcpy["stream_s"])]  # same bytes: rate ratio
    lat_us = np.asarray(cell["each_s"]) * 1e6
    return {"block_bytes": b, "num_blocks": n, "gbps_median": float(np.median(gbps)), "gbps_min": min(gbps),
            "gbps_max": max(gbps), "gbps_rounds": gbps, "ratio_to_memcpy": float(np.median(ratios)),
            "latency_p50_us": float(np.percentile(lat_us, 50)), "latency_p90_us": float(np.percentile(lat_us, 90)),
            "latency_samples": len(lat_us), "intact": bool(cell["intact"])}


def _mooncake_breakdown(rows: dict[str, Any], samples: dict[str, list[dict[str, float]]], sizes: dict[str, int],
                        total_bytes: int) -> dict[str, Any]:
    """Per size, Mooncake's time per block in a stream, cut in three from the medians of the same rounds:
    the bytes at its one-batch rate, the rest of one synchronous write call per block (the per-call
    cost its batch API saves), and the rest through the link (the arbiter's chunks and hand-off)."""
    out = {}
    for name, b in sizes.items():
        moved = total_bytes // b * b
        per_block = float(np.median([moved / s["sync_per_block_s"] / 1e9 for s in samples[name]]))
        batch = float(np.median([moved / s["one_batch_s"] / 1e9 for s in samples[name]]))
        link = rows["mooncake"][name]["gbps_median"]
        us = {k: b / gbps / 1e3 for k, gbps in (("link", link), ("call", per_block), ("batch", batch))}  # GB/s -> us per block
        out[name] = {"link_gbps_median": link, "sync_per_block_gbps_median": per_block, "one_batch_gbps_median": batch,
                     "us_per_block": us["link"], "bytes_us_per_block": us["batch"],
                     "per_call_us_per_block": us["call"] - us["batch"], "link_us_per_block": us["link"] - us["call"],
                     "tcp_gbps_median": rows["tcp"][name]["gbps_median"]}
    return out


def _notes(r: dict[str, Any]) -> list[str]:
    """One line per skipped transfer and, where Mooncake is slower than our TCP writes, where its time goes."""
    notes = [f"{t}: skipped: {why}" for t, why in r["skipped"].items()]
    for name, d in r.get("mooncake_breakdown", {}).items():
        if d["link_gbps_median"] >= d["tcp_gbps_median"]:
            continue
        notes.append(
            f"mooncake {name}: {d['link_gbps_median']:.2f} GB/s vs tcp {d['tcp_gbps_median']:.2f}; its "
            f"{d['us_per_block']:,.0f} us per block = {d['bytes_us_per_block']:,.0f} us of bytes at its one-batch rate "
            f"({d['one_batch_gbps_median']:.2f} GB/s) {d['per_call_us_per_block']:+,.0f} us per synchronous write call "
            f"({d['sync_per_block_gbps_median']:.2f} GB/s one call per block) {d['link_us_per_block']:+,.0f} us through "
            f"the link (arbiter chunks, thread hand-off)")
    return notes


def plot_transport(r: dict[str, Any], path: Path) -> None:
    """Throughput (median bar, min-max whisker) and per-block latency (p50 bar, p90 whisker) by transfer and size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes, transfers = list(r["sizes"]), r["transfers"]
    width = 0.8 / len(transfers)
    fig, (ax_rate, ax_lat) = plt.subplots(1, 2, figsize=(11, 4))
    for i, t in enumerate(transfers):
        xs = [j + (i - (len(transfers) - 1) / 2) * width for j in range(len(sizes))]
        cells = [r["rows"][t][s] for s in sizes]
        med = [c["gbps_median"] for c in cells]
        ax_rate.bar(xs, med, width, label=t, yerr=[[m - c["gbps_min"] for m, c in zip(med, cells)],
                                                   [c["gbps_max"] - m for m, c in zip(med, cells)]], capsize=3)
        p50 = [c["latency_p50_us"] for c in cells]
        ax_lat.bar(xs, p50, width, label=t, yerr=[[0] * len(cells), [c["latency_p90_us"] - p for p, c in zip(p50, cells)]],
                   capsize=3)
    labels = [f"{s}\n{r['sizes'][s] / 1024:,.0f} KiB" for s in sizes]
    for ax in (ax_rate, ax_lat):
        ax.set_xticks(range(len(sizes)), labels)
    ax_rate.set_ylabel("GB/s (median of rounds, min-max)")
    ax_lat.set_ylabel("per-block latency, us (p50, whisker p90)")
    ax_lat.set_yscale("log")
    ax_rate.legend()
    fig.suptitle(f"KV transfers, {r['total_bytes'] / 2**20:.1f} MiB per transfer per size per round, {r['rounds']} rounds, {r['cpus']} CPUs")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
