"""`dualpath bench tp-lanes --testbed`: TPOT of a tensor-parallel decode engine whose collectives
ride the latency-critical lane, beside saturating KV traffic (docs/results/testbed/tp_lanes.json).

On a 1P1D testbed plus a host of its own for the DE's rank 1 (deploy/testbed/tp_hosts.py):
  1. rank 0 (deploy/testbed/tp_decode.py) runs in the DE host, rank 1 in `<base>-d0t`; the rank pair's
     packets are steered to class 1:10 by address on the four CNIC ends they cross.
  2. The CNIC rate is derived on the running testbed: one measurement at a provisional rate
     gives the decode step time and the collectives' payload bytes per step; the rate is set so
     that those bytes take COLLECTIVE_SHARE of the step on the wire (real, not dominant), then
     `tc class change` re-rates every CNIC end. Optionally GSO is capped on every link
     (`gso_max_bytes`, deploy/testbed/tp_hosts.py 3): smaller units on the wire, more packets to process.
  3. Six measurements of a batch of decode steps: {idle, KV elsewhere, KV saturated} x {two
     classes (99:1), one class (the filters removed: one FIFO at the link rate)}. "KV saturated":
     bulk CS1 flows both ways over the DE's CNIC link (PE -> DE and DE -> PE), as the layer
     streams and PD transfers cross it. "KV elsewhere", the CPU control: the same two flows at the
     same rate between the PE and the storage host (its SNIC link, re-rated to the CNIC rate), so
     they cost the CPUs what the saturating ones cost but cross no link of the DE's. On a machine
     with spare cores it equals idle; on a busy 2-core one, saturated / elsewhere is the lanes'
     own effect and saturated / idle adds the flows' CPU cost.
Each measurement also records what the kernel counted in 1:10 and 1:20 on the DE's CNIC ends.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import numpy as np

from .netns import class_bytes, down, run_command, up
from .lanes_bench import BULK_SOURCE, mooncake_bulk
from .plan import _bits, plan_testbed
from .tp_hosts import cnic_ends, gso_commands, rate_commands, tp_filter_commands, tp_host_of, with_tp_hosts

# The collectives' wire time as a share of a decode step at the derived CNIC rate: large enough
# that queueing behind KV would show in TPOT, small enough that the network does not dominate it
# (project choice; Megatron-style TP on NVLink spends ~10-30% of a decode step communicating).
COLLECTIVE_SHARE = 0.25
PROVISIONAL_CNIC_BYTES_PER_S = 1e9  # the calibration run's rate: far above what the steps need
SNIC_BYTES_PER_S = 50e6  # unused by this bench (no storage traffic); any positive rate
BULK_PORT = 7421
# The bulk flows' processes run under SCHED_IDLE (`chrt --idle 0`, sched(7)): a rank that wakes on
# a collective's bytes preempts them at once, where a nice-19 task still holds the CPU until the
# scheduler's wakeup granularity passes (at nice 19, TPOT reached 1.35x idle:
# docs/results/testbed/tp_lanes_gso16k_d.json)
BULK_SCHED = ("chrt", "--idle", "0")
BULK_WARMUP_S = 1.0  # the bulk flows' TCP windows open before steps are timed (deploy/testbed/lanes_bench.py: 0.5 s)
# prefills of one 64-token prompt per load and round, timed after its decode steps under the same
# load: the first token's compute and collectives (TTFT on an idle engine); project choice
PREFILLS_PER_ROUND = 2
BOOTSTRAP_RESAMPLES = 2000  # resamples of the per-round ratios for the median's 95% interval (paired_ratio)
RUN_INDEX = 246  # the testbed's address block: apart from the other benches' and tests' (248, 250, 251)

# The emulated KV flows, as NICs would move them: without copying the bytes through user space.
# A real node's RDMA NIC moves KV by DMA with no host CPU; the copying flows (`--bulk-copy`:
# deploy/testbed/lanes_bench.py's sendall source, a recv_into sink) cost the ranks' two cores a memcpy of
# every byte at each end (1.08-1.18x TPOT from that alone: `--bulk-copy`). The zero-copy source sends one tmpfs
# file's pages with sendfile(2); the sink drops what arrives with MSG_TRUNC (tcp(7): discards
# without copying) and wakes once per SINK_LOWAT_BYTES (SO_RCVLOWAT, socket(7)). The kernel's
# TCP, veth and HTB work per packet is unchanged.
SOURCE_FILE_BYTES = 4 << 20  # the file sendfile(2) repeats: large against one GSO unit (64 KiB)
SINK_LOWAT_BYTES = 256 << 10  # ~8 ms of one flow at ~30 MB/s: a few wakeups per decode step (project choice)
_ZERO_COPY_SOURCE = r"""
import os, socket, sys, tempfile
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 8 << 2)
n = int(sys.argv[3]); f = tempfile.TemporaryFile(dir="/dev/shm"); f.write(b"\xa5" * n); f.flush()
while True:
    off = 0
    while off < n:
        off += os.sendfile(c.fileno(), f.fileno(), off, n - off)
"""
_SINK = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); print("ready", flush=True)
c, _ = s.accept(); buf = bytearray(1 << 20); lowat = int(sys.argv[3]); flags = socket.MSG_TRUNC if lowat else 0
if lowat:
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, lowat)
while c.recv_into(buf, len(buf), flags):
    pass
"""


class TpDecode:
    """deploy/testbed/tp_decode.py as rank 0 in `ns`: its ready line, then measurements on request."""

    def __init__(self, plan, engine_host: str, model: str, batch: int, threads: int = 1) -> None:
        tp_ns = tp_host_of(engine_host)
        argv = ["ip", "netns", "exec", engine_host, sys.executable, "-m", "dualpath.deploy.testbed.tp_decode", "--model", model,
                "--batch", str(batch), "--threads", str(threads), "--leader-host", plan.cnic_addr_of[engine_host],
                "--follower-host", plan.cnic_addr_of[tp_ns], "--follower-netns", tp_ns]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.ready = self._line()

    def _line(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"tp_decode ended (code {self.proc.wait()}) before answering")
        return json.loads(line)

    def measure(self, name: str, steps: int, what: str = "measure") -> dict:
        """`what`: "measure" (decode steps) or "prefill" (`steps` prefills of one prompt)."""
        self.proc.stdin.write(f"{what} {name} {steps}\n")
        self.proc.stdin.flush()
        return self._line()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()


BULK_KINDS = ("zero_copy", "copy", "mooncake")


def start_bulk(src_ns: str, dst_ns: str, dst_addr: str, port: int, kind: str = "zero_copy",
               src_addr: str = "") -> list[subprocess.Popen]:
    """A saturating KV-class flow from src_ns to a sink at dst_addr in dst_ns. Both ends run at the
    lowest CPU priority (BULK_SCHED). `kind`: "zero_copy" copies no byte through user space (the
    zero-copy source and sink above: in the paper's node the NICs move KV by RDMA without the host
    CPU, so the emulation's senders and sinks should take only what the ranks leave); "copy", a
    CS1 sender and sink that copy every byte; "mooncake", Mooncake Transfer Engine writing from a
    registered buffer at `src_addr` into one at `dst_addr` (unmarked TCP: the default class, KV's),
    as the engines' KV moves with `--transfer mooncake`."""
    if kind == "mooncake":
        return mooncake_bulk(src_ns, dst_ns, src_addr, dst_addr, BULK_SCHED)
    zero_copy = kind == "zero_copy"
    sink = subprocess.Popen(["ip", "netns", "exec", dst_ns, *BULK_SCHED, sys.executable, "-c", _SINK,
                             dst_addr, str(port), str(SINK_LOWAT_BYTES if zero_copy else 0)],
                            stdout=subprocess.PIPE, text=True)
    if sink.stdout.readline().strip() != "ready":
        raise RuntimeError(f"bulk sink in {dst_ns} did not start")
    code = [_ZERO_COPY_SOURCE, dst_addr, str(port), str(SOURCE_FILE_BYTES)] if zero_copy else [BULK_SOURCE, dst_addr, str(port)]
    source = subprocess.Popen(["ip", "netns", "exec", src_ns, *BULK_SCHED, sys.executable, "-c", *code],
                              stderr=subprocess.DEVNULL)  # killed mid-send: its reset is expected
    return [source, sink]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def de_class_bytes(plan, host: str) -> dict[str, dict[str, int]]:
    """1:10 / 1:20 bytes on both ends of `host`'s CNIC link: its egress (out) and the fabric's (in)."""
    out = {}
    for side, (ns, dev) in zip(("out", "in"), cnic_ends(plan, host)):
        by = class_bytes(ns, dev)
        out[side] = {"lc_class_bytes": by.get(10, 0), "kv_class_bytes": by.get(20, 0)}
    return out


def _delta(after: dict, before: dict) -> dict:
    return {side: {k: after[side][k] - before[side][k] for k in after[side]} for side in after}


def _stats(step_s: list[float]) -> dict[str, float]:
    a = np.asarray(step_s)
    return {"steps": len(step_s), "tpot_mean_s": float(a.mean()), "tpot_p50_s": float(np.percentile(a, 50)),
            "tpot_p99_s": float(np.percentile(a, 99))}


LOADS = ("idle", "kv_elsewhere", "saturated")


def _start_load(plan, load: str, kind: str) -> list[subprocess.Popen]:
    """The bulk flows of `load` (module doc, 3)."""
    pe, de = plan.hosts
    if load == "saturated":  # both directions of the DE's CNIC: PE -> DE (layer streams' way) and DE -> PE (PD's)
        pe_ip, de_ip = plan.cnic_addr_of[pe], plan.cnic_addr_of[de]
        return (start_bulk(pe, de, de_ip, BULK_PORT, kind, pe_ip) + start_bulk(de, pe, pe_ip, BULK_PORT + 1, kind, de_ip))
    if load == "kv_elsewhere":  # the same two flows over the PE's SNIC link, storage <-> PE
        snic = next(x for x in plan.links if x.name == "snic" and x.host == pe)
        st_ip, pe_ip = snic.a_addr.split("/")[0], snic.b_addr.split("/")[0]
        return (start_bulk(snic.a_ns, pe, pe_ip, BULK_PORT, kind, st_ip)
                + start_bulk(pe, snic.a_ns, st_ip, BULK_PORT + 1, kind, pe_ip))
    return []


def _measure(dec: TpDecode, plan, name: str, steps: int, load: str, kind: str) -> dict[str, Any]:
    de = plan.hosts[1]
    bulk: list[subprocess.Popen] = []
    try:
        bulk = _start_load(plan, load, kind)
        if bulk:
            time.sleep(BULK_WARMUP_S)
        before = de_class_bytes(plan, de)
        r = dec.measure(name, steps)
        after = de_class_bytes(plan, de)
        first = dec.measure(name, PREFILLS_PER_ROUND, "prefill")  # under the same load: TTFT
    finally:
        stop(bulk)
    return {"step_s": r["step_s"], "prefill_s": first["prefill_s"], "payload_bytes": r["payload_bytes"],
            "kernel": _delta(after, before)}


def _merge(parts: list[dict]) -> dict[str, Any]:
    """One run from its rounds: statistics over every step, bytes summed."""
    steps = [t for p in parts for t in p["step_s"]]
    kernel = {side: {k: sum(p["kernel"][side][k] for p in parts) for k in parts[0]["kernel"][side]}
              for side in parts[0]["kernel"]}
    first = np.asarray([t for p in parts for t in p["prefill_s"]])
    return {**_stats(steps), "ttft_mean_s": float(first.mean()), "prefills": int(first.size), "rounds": len(parts),
            "payload_bytes": sum(p["payload_bytes"] for p in parts), "kernel": kernel}


def _measure_all(dec: TpDecode, plan, steps: int, rounds: int, rate_bytes_per_s: float,
                 kind: str) -> tuple[dict, dict]:
    """Every load with two classes, then with one; the loads interleaved over `rounds` rounds of
    steps // rounds steps each, so that a slow spell of a shared machine spreads over all of them.
    (The runs by load and classes, the ratios paired by round by classes.)"""
    runs, paired = {}, {}
    for classes in ("two_classes", "one_class"):
        if classes == "one_class":
            _one_class(plan, rate_bytes_per_s)
        parts: dict[str, list] = {load: [] for load in LOADS}
        for _ in range(rounds):
            for load in LOADS:
                parts[load].append(_measure(dec, plan, f"{load}_{classes}", max(1, steps // rounds), load, kind))
        runs.update({f"{load}_{classes}": _merge(parts[load]) for load in LOADS})
        paired[classes] = {f"{load}_over_{base}": paired_ratio(parts[load], parts[base])
                                     for load, base in (("saturated", "idle"), ("saturated", "kv_elsewhere"),
                                                        ("kv_elsewhere", "idle"))}
    return runs, paired


def paired_ratio(loaded: list[dict], base: list[dict], resamples: int = BOOTSTRAP_RESAMPLES) -> dict[str, Any]:
    """Mean TPOT under a load over the same round's under the base, one ratio per round (the two
    measured minutes apart, so a slow spell of the machine hits both); their median and its 95%
    bootstrap interval (seeded: the same rounds give the same interval)."""
    ratios = np.asarray([np.mean(a["step_s"]) / np.mean(b["step_s"]) for a, b in zip(loaded, base)])
    rng = np.random.default_rng(0)
    medians = np.median(rng.choice(ratios, size=(resamples, ratios.size)), axis=1)
    lo, hi = np.percentile(medians, [2.5, 97.5])
    return {"per_round": [float(x) for x in ratios], "median": float(np.median(ratios)), "ci95": [float(lo), float(hi)]}


def _one_class(plan, rate_bytes_per_s: float) -> None:
    """Every filter off every CNIC end, so all packets take the default class 1:20, re-rated to the
    whole link: one FIFO at the link rate (not a 1% class borrowing the rest)."""
    for link in plan.links:
        if link.name == "cnic":
            for ns, dev in ((link.a_ns, link.a_if), (link.b_ns, link.b_if)):
                run_command(["ip", "netns", "exec", ns, "tc", "filter", "del", "dev", dev, "parent", "1:"])
                run_command(["ip", "netns", "exec", ns, "tc", "class", "change", "dev", dev, "parent", "1:1", "classid",
                             "1:20", "htb", "rate", _bits(rate_bytes_per_s), "ceil", _bits(rate_bytes_per_s)])


def _derive_rate(dec: TpDecode, plan, steps: int) -> dict[str, float]:
    """Module doc, 2: the rate at which the collectives' bytes take COLLECTIVE_SHARE of a step.
    The bytes are what the kernel counted in 1:10 on the busier direction of the DE's CNIC (gloo's
    framing and TCP/IP headers included: ~1.6x the tensors' bytes for the tiny model's small ones)."""
    de = plan.hosts[1]
    before = de_class_bytes(plan, de)
    calib = dec.measure("calibrate", steps)
    lc = _delta(de_class_bytes(plan, de), before)
    step_s = float(np.median(calib["step_s"]))
    num_steps = len(calib["step_s"])
    wire_per_step = max(side["lc_class_bytes"] for side in lc.values()) / num_steps
    rate = wire_per_step / (COLLECTIVE_SHARE * step_s)
    for cmd in rate_commands(plan, rate, ("cnic", "snic")):  # the SNIC too: the CPU control's flows (module doc)
        run_command(cmd)
    return {"calibration_step_s": step_s, "payload_bytes_per_step": calib["payload_bytes"] / num_steps,
            "wire_bytes_per_step": wire_per_step, "collective_share": COLLECTIVE_SHARE,
            "provisional_cnic_bytes_per_s": PROVISIONAL_CNIC_BYTES_PER_S, "cnic_bytes_per_s": rate}


def run_tp_lanes(model: str = "smollm2-135m", batch: int = 8, steps: int = 40, cnic_bytes_per_s: float | None = None,
                 run_id: str | None = None, rounds: int = 2, gso_max_bytes: int | None = None,
                 bulk: str = "zero_copy") -> dict[str, Any]:
    """The six measurements (module doc), in `rounds` interleaved rounds; `cnic_bytes_per_s`
    given: that rate (CNIC and SNIC), not derived; `bulk`: the KV flows' kind (BULK_KINDS, `start_bulk`)."""
    if bulk not in BULK_KINDS:
        raise ValueError(f"bulk must be one of {', '.join(BULK_KINDS)}, got {bulk!r}")
    base = plan_testbed(run_id or f"tp{os.getpid() % 1000}", 1, 1, SNIC_BYTES_PER_S,
                        cnic_bytes_per_s or PROVISIONAL_CNIC_BYTES_PER_S, run_index=RUN_INDEX)
    de = base.hosts[1]
    plan = with_tp_hosts(base, (de,))
    up(plan)
    dec = None
    try:
        for cmd in tp_filter_commands(plan, de) + ([] if gso_max_bytes is None else gso_commands(plan, gso_max_bytes)):
            run_command(cmd)
        dec = TpDecode(plan, de, model, batch)
        rate = ({"cnic_bytes_per_s": cnic_bytes_per_s} if cnic_bytes_per_s else _derive_rate(dec, plan, steps))
        runs, paired = _measure_all(dec, plan, steps, rounds, rate["cnic_bytes_per_s"], bulk)
    finally:
        if dec is not None:
            dec.close()
        down(plan.run_id)
    return {"model": model, "batch": batch, "steps": steps, "rounds": rounds, "gso_max_bytes": gso_max_bytes,
            "bulk": bulk,
            "same_tokens": dec.ready["same_tokens"],
            **rate, "runs": runs, "paired_by_round": paired, "tpot_saturated_over_idle": _ratio(runs, "saturated", "idle"),
            "tpot_saturated_over_kv_elsewhere": _ratio(runs, "saturated", "kv_elsewhere"),
            "ttft_saturated_over_idle": _ratio(runs, "saturated", "idle", "ttft_mean_s")}


def _ratio(runs: dict, load: str, base: str, key: str = "tpot_mean_s") -> dict[str, float]:
    """Mean TPOT (or `key`) under `load` over the same under `base`, per class setup."""
    return {c: runs[f"{load}_{c}"][key] / runs[f"{base}_{c}"][key] for c in ("two_classes", "one_class")}


def plot_tp_lanes(result: dict[str, Any], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.5))
    for i, classes in enumerate(("two_classes", "one_class")):
        vals = [result["runs"][f"{load}_{classes}"]["tpot_mean_s"] * 1e3 for load in LOADS]
        ax.bar([j + 0.38 * i for j in range(len(LOADS))], vals, 0.38, label=classes.replace("_", " ") +
               f" (saturated x{result['tpot_saturated_over_idle'][classes]:.2f} of idle)")
    ax.set_xticks([j + 0.19 for j in range(len(LOADS))], ["no KV traffic", "KV elsewhere (CPU control)", "KV saturated"])
    ax.set_ylabel("TPOT (decode step), ms")
    ax.set_title(f"tp=2 {result['model']} decode, batch {result['batch']}, "
                 f"CNIC {result['cnic_bytes_per_s'] / 1e6:.0f} MB/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
