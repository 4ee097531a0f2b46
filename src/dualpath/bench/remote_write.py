"""`dualpath bench remote-write`: remote writes over loopback TCP against memcpy into shared
memory, GB/s side by side.

Moves --total-mib MiB in --chunk-mib MiB chunks into a host buffer (a POSIX shared-memory
segment of --region-mib MiB, cycled), four ways:

  memcpy             ContiguousCopy chunk by chunk into the segment (today's same-host path)
  memcpy + arbiter   the same through an unlimited LinkArbiter (what every engine copy pays)
  remote             WriteInitiator.write chunk by chunk to a WriteTarget in another process that
                     registered the segment, then one IMM; timed until the IMM is delivered there
  remote + arbiter   RemoteSpanWrite transfers through an unlimited LinkArbiter, IMM after each

The target runs in a child process (spawn), as the PE's target would in the PE's process, so the
sender's and receiver's Python do not share one GIL. Each way runs --repeat times; the best run
counts (GB/s = 1e9 bytes per second).

    dualpath bench remote-write [--total-mib 1024] [--chunk-mib 1] [--json F]
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import time

import numpy as np

from ..core.lanes import Lane, LaneWeights
from ..errors import InputError
from ..runtime.clock import MonotonicClock
from ..runtime.transport.arbiter import LinkArbiter
from ..runtime.transport.remote_write import RemoteSpanWrite, WriteInitiator, WriteTarget, submit_with_immediate
from ..runtime.transport.shm import HostBuffer, SharedSegments, ShmRegion
from ..runtime.transport.transfer import ContiguousCopy

MIB = 2**20
CHILD_WAIT_S = 120.0  # the child's start-up and a slow 1 GiB run on a loaded 2-core machine


def target_child(segment: str, nbytes: int, ports: "mp.Queue", done: "mp.Queue", stop) -> None:
    """The receiving process: attach the segment, register it, report every IMM on `done`
    (with the time it was delivered), until the parent sets `stop`."""
    segments = SharedSegments()
    view = segments.view(ShmRegion(segment, 0, nbytes))
    target = WriteTarget("127.0.0.1", 0, on_immediate=lambda lane, msg: done.put((time.perf_counter(), msg)))
    target.register(segment, view)
    ports.put(target.address[1])
    stop.wait()
    target.close()
    target.unregister(segment)
    del view
    segments.close()


def memcpy_run(dst: np.ndarray, src: np.ndarray, total: int, chunk: int) -> float:
    copy = ContiguousCopy(dst, src)
    t0 = time.perf_counter()
    for pos in range(0, total, chunk):
        copy(pos % dst.size, min(chunk, total - pos))
    return time.perf_counter() - t0


def memcpy_arbiter_run(dst: np.ndarray, src: np.ndarray, total: int, chunk: int) -> float:
    with LinkArbiter("bench", None, LaneWeights(), MonotonicClock(), chunk_bytes=chunk) as arb:
        copy = ContiguousCopy(dst, src)
        t0 = time.perf_counter()
        handles = [arb.submit(Lane.KV, min(dst.size, total - pos), copy) for pos in range(0, total, dst.size)]
        for h in handles:
            h.wait()
        return time.perf_counter() - t0


def remote_run(initiator: WriteInitiator, segment: str, region_bytes: int, src: np.ndarray, total: int,
               chunk: int, done: "mp.Queue", tag: bytes) -> float:
    t0 = time.perf_counter()
    for pos in range(0, total, chunk):
        at = pos % region_bytes
        initiator.write(Lane.KV, segment, at, src[at:at + min(chunk, total - pos)])
    initiator.immediate(Lane.KV, tag)
    t1, msg = done.get(timeout=CHILD_WAIT_S)
    assert msg == tag, msg
    return t1 - t0


def remote_arbiter_run(initiator: WriteInitiator, segment: str, region_bytes: int, src: np.ndarray, total: int,
                       chunk: int, done: "mp.Queue", tag: bytes) -> float:
    with LinkArbiter("bench", None, LaneWeights(), MonotonicClock(), chunk_bytes=chunk) as arb:
        t0 = time.perf_counter()
        starts = list(range(0, total, region_bytes))
        for i, pos in enumerate(starts):
            n = min(region_bytes, total - pos)
            job = RemoteSpanWrite(initiator, Lane.KV, src, [(0, n)], ShmRegion(segment, 0, region_bytes), [(0, n)])
            submit_with_immediate(arb, job, lambda _res, i=i: tag + b"%d" % i)
        for _ in starts:
            t1, msg = done.get(timeout=CHILD_WAIT_S)
        assert msg == tag + b"%d" % (len(starts) - 1), msg
        return t1 - t0


def run_remote_write_bench(total: int, chunk: int, region_bytes: int, repeat: int) -> dict:
    """Each way's best seconds and GB/s over `repeat` runs (module docstring); the landed bytes checked."""
    if min(total, chunk, region_bytes, repeat) <= 0 or chunk > region_bytes:
        raise InputError("sizes and --repeat must be positive, and --chunk-mib at most --region-mib")
    src = np.random.default_rng(0).integers(0, 256, region_bytes, dtype=np.uint8)
    rows: dict[str, float] = {}
    ctx = mp.get_context("spawn")
    with HostBuffer.create(slot_bytes=region_bytes, num_slots=1) as buf:
        dst = buf.view(ShmRegion(buf.name, 0, region_bytes))
        rows["memcpy"] = min(memcpy_run(dst, src, total, chunk) for _ in range(repeat))
        rows["memcpy + arbiter"] = min(memcpy_arbiter_run(dst, src, total, chunk) for _ in range(repeat))
        dst[:] = 0  # what the remote ways land must be theirs
        ports, done, stop = ctx.Queue(), ctx.Queue(), ctx.Event()
        child = ctx.Process(target=target_child, args=(buf.name, region_bytes, ports, done, stop), daemon=True)
        child.start()
        try:
            port = ports.get(timeout=CHILD_WAIT_S)
            with WriteInitiator("127.0.0.1", port, lanes=(Lane.KV,)) as initiator:
                rows["remote"] = min(remote_run(initiator, buf.name, region_bytes, src, total, chunk, done, b"r%d" % i)
                                     for i in range(repeat))
                rows["remote + arbiter"] = min(
                    remote_arbiter_run(initiator, buf.name, region_bytes, src, total, chunk, done, b"a%d-" % i)
                    for i in range(repeat))
            covered = min(total, region_bytes)
            if not np.array_equal(dst[:covered], src[:covered]):
                raise RuntimeError("the landed bytes differ from the source")
        finally:
            stop.set()
            child.join(CHILD_WAIT_S)
        del dst
    return {"total_bytes": total, "chunk_bytes": chunk, "region_bytes": region_bytes, "repeat": repeat,
            "machine": platform.platform(), "cpus": os.cpu_count(),
            "rows": {k: {"seconds": s, "gb_per_s": total / s / 1e9} for k, s in rows.items()}}
