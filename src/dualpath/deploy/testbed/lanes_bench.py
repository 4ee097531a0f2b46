"""`dualpath bench lanes --testbed`: latency-critical bursts across emulated hosts, through the
kernel's classes (docs/results/testbed/lanes.json).

On a 1P1D testbed (`deploy/testbed/`), the DE host sends 64 KiB bursts to the PE host over their CNIC
link, each marked EF (the latency-critical lane) and answered by a 1-byte reply, one every
BURST_PERIOD_S. A burst's time runs from its first byte sent to the reply. Three runs:
  unloaded       the bursts alone;
  two classes    beside a bulk KV transfer (CS1) that keeps the link busy: the testbed's HTB
                 classes, 99:1;
  one class      the same load with the DSCP filters removed, so every packet shares the KV class:
                 one FIFO, what the lanes buy against.
The bulk load is a plain TCP sender marked CS1 (`bulk="tcp"`), or Mooncake Transfer Engine writing
4 MiB at a time from a registered buffer on the DE host into one on the PE host (`bulk="mooncake"`):
what the engines' KV is with `--transfer mooncake`. Its TCP carries no DSCP mark, so it takes each
port's default class, the KV class.
Each burst crosses two shaped egresses (DE host -> switch, switch -> PE host), as a packet crosses
a NIC and a switch port.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Any

import numpy as np

from .netns import down, link_counters, run_command, up
from .plan import plan_testbed

BURST_BYTES = 64 * 1024  # a latency-critical message: the in-process lanes bench's burst size
BURST_PERIOD_S = 0.005  # one burst every 5 ms, as bench/lanes.py
BURST_PORT, BULK_PORT = 7412, 7413
WARMUP_S = 0.5  # the bulk flow's TCP window opens before bursts are timed

_SERVER = r"""
import socket, sys, threading
def bulk():
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((sys.argv[1], int(sys.argv[3]))); s.listen(1)
    while True:
        c, _ = s.accept(); buf = bytearray(1 << 20)
        while c.recv_into(buf):
            pass
threading.Thread(target=bulk, daemon=True).start()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 46 << 2)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n = int(sys.argv[4]); buf = bytearray(n)
while True:
    got = 0
    while got < n:
        k = c.recv_into(memoryview(buf)[got:])
        if not k:
            sys.exit(0)
        got += k
    c.sendall(b"!")
"""

# a saturating CS1 (KV-class) sender: 1 MiB blocks as fast as the link takes them (also deploy/testbed/tp_lanes_bench.py)
BULK_SOURCE = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 8 << 2)
block = b"\xa5" * (1 << 20)
while True:
    c.sendall(block)
"""

# Mooncake's bulk: the sink registers a buffer on the PE host and prints its address; the source, on
# the DE host, writes into it BULK_WRITE_BYTES at a time for as long as it runs, and says "flowing"
# once its first write has landed (its engine's start can take longer than WARMUP_S on a loaded host)
BULK_WRITE_BYTES = 4 * 1024 * 1024
MOONCAKE_SINK = r"""
import sys, time
import numpy as np
from dualpath.runtime.transport.mooncake import MooncakeTransfer
t = MooncakeTransfer.start(sys.argv[1])
t.register("bulk", np.zeros(int(sys.argv[2]), dtype=np.uint8))
print(t.address().to_text(), flush=True)
while True:
    time.sleep(60)
"""
MOONCAKE_SOURCE = r"""
import sys
import numpy as np
from dualpath.runtime.transport.mooncake import MooncakeAddress, MooncakeTransfer, address_of
t = MooncakeTransfer.start(sys.argv[1])
src = np.full(int(sys.argv[3]), 0xA5, dtype=np.uint8)
t.register("src", src)
peer = MooncakeAddress.from_text(sys.argv[2])
t.write(peer, [(address_of(src), "bulk", 0, src.nbytes)])
print("flowing", flush=True)
while True:
    t.write(peer, [(address_of(src), "bulk", 0, src.nbytes)])
"""
MOONCAKE_START_TIMEOUT_S = 60.0  # the source's engine start and first write, on a loaded 2-core host

_BURSTS = r"""
import json, socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])))
c.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 46 << 2)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
n, count, period = int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
msg = b"\x3c" * n; out = []
nxt = time.perf_counter()
for _ in range(count):
    t0 = time.perf_counter(); c.sendall(msg); c.recv(1); out.append(time.perf_counter() - t0)
    nxt += period
    time.sleep(max(0.0, nxt - time.perf_counter()))
print(json.dumps(out))
"""


def _bursts(plan, count: int, bulk_kind: str | None) -> list[float]:
    """The bursts' times, alone (`bulk_kind` None) or beside a bulk load of that kind."""
    de, pe = plan.hosts[1], plan.hosts[0]
    pe_ip = plan.cnic_addr_of[pe]
    exe = sys.executable
    server = subprocess.Popen(["ip", "netns", "exec", pe, exe, "-c", _SERVER, pe_ip, str(BURST_PORT), str(BULK_PORT),
                               str(BURST_BYTES)], stdout=subprocess.PIPE, text=True)
    procs = [server]
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        if bulk_kind == "tcp":
            procs.append(subprocess.Popen(["ip", "netns", "exec", de, exe, "-c", BULK_SOURCE, pe_ip, str(BULK_PORT)],
                                          stderr=subprocess.DEVNULL))  # killed mid-send: its reset is expected
        elif bulk_kind == "mooncake":
            procs += mooncake_bulk(de, pe, plan.cnic_addr_of[de], pe_ip)
        if bulk_kind is not None:
            time.sleep(WARMUP_S)
        p = subprocess.run(["ip", "netns", "exec", de, exe, "-c", _BURSTS, pe_ip, str(BURST_PORT), str(BURST_BYTES),
                            str(count), str(BURST_PERIOD_S)], capture_output=True, text=True, check=True,
                           timeout=60 + count * 0.5)
        return json.loads(p.stdout)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def mooncake_bulk(src_ns: str, dst_ns: str, src_ip: str, dst_ip: str,
                  prefix: tuple[str, ...] = ()) -> list[subprocess.Popen]:
    """Mooncake's sink in dst_ns at dst_ip, then its source in src_ns at src_ip writing into it
    (each command after `prefix`, e.g. a scheduling class)."""
    exe = sys.executable
    sink = subprocess.Popen(["ip", "netns", "exec", dst_ns, *prefix, exe, "-c", MOONCAKE_SINK, dst_ip,
                             str(BULK_WRITE_BYTES)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert sink.stdout is not None
    address = sink.stdout.readline().strip()
    if not address:
        sink.kill()
        raise RuntimeError(f"Mooncake's sink did not start in {dst_ns} (is Mooncake Transfer Engine installed?)")
    source = subprocess.Popen(["ip", "netns", "exec", src_ns, *prefix, exe, "-c", MOONCAKE_SOURCE, src_ip, address,
                               str(BULK_WRITE_BYTES)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if _first_line(source, MOONCAKE_START_TIMEOUT_S) != "flowing":  # the bulk is on the wire before bursts are timed
        for proc in (source, sink):
            proc.kill()
            proc.wait()
        raise RuntimeError(f"Mooncake's source in {src_ns} wrote nothing into {dst_ns} within {MOONCAKE_START_TIMEOUT_S:g} s")
    return [source, sink]


def _first_line(proc: subprocess.Popen, timeout_s: float) -> str:
    """The first line `proc` prints, or "" if it prints none (or exits) within `timeout_s`."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    return proc.stdout.readline().strip() if ready else ""


def _kv_class_bytes(plan) -> dict[str, int]:
    """The DE host's CNIC port: bytes its two classes sent (the unloaded and two-class runs so far)."""
    row = next(x for x in link_counters(plan) if x["link"] == "cnic" and x["ns"] == plan.hosts[1] and x["dev"] == "cnic0")
    return {"lc": int(row["lc_class_bytes"]), "kv": int(row["kv_class_bytes"])}


def _one_class(plan) -> None:
    """Remove the DSCP filters on the CNIC link: every packet then takes the default KV class."""
    for link in plan.links:
        if link.name == "cnic":
            for ns, dev in ((link.a_ns, link.a_if), (link.b_ns, link.b_if)):
                run_command(["ip", "netns", "exec", ns, "tc", "filter", "del", "dev", dev, "parent", "1:"])


def _stats(xs: list[float]) -> dict[str, float]:
    a = np.asarray(xs)
    return {"count": len(xs), "p50_s": float(np.percentile(a, 50)), "p99_s": float(np.percentile(a, 99)),
            "mean_s": float(a.mean())}


def run_lanes_testbed(cnic_bytes_per_s: float, bursts: int, run_id: str | None = None,
                      bulk: str = "tcp") -> dict[str, Any]:
    """The three runs (module doc); `bulk`: the KV load, "tcp" or "mooncake"."""
    plan = plan_testbed(run_id or f"l{os.getpid() % 10000}", 1, 1, cnic_bytes_per_s / 8, cnic_bytes_per_s, run_index=248)
    up(plan)
    try:
        runs = {"unloaded": _stats(_bursts(plan, bursts, None)), "two_classes": _stats(_bursts(plan, bursts, bulk))}
        kv_class = _kv_class_bytes(plan)  # the bulk load's bytes so far, every one in the KV class
        _one_class(plan)
        runs["one_class"] = _stats(_bursts(plan, bursts, bulk))
    finally:
        down(plan.run_id)
    base = runs["unloaded"]["p99_s"]
    return {"cnic_bytes_per_s": cnic_bytes_per_s, "burst_bytes": BURST_BYTES, "burst_period_s": BURST_PERIOD_S,
            "bulk": bulk, "bulk_write_bytes": BULK_WRITE_BYTES if bulk == "mooncake" else None,
            "de_port_class_bytes": kv_class,
            "wire_time_s": BURST_BYTES / cnic_bytes_per_s, "runs": runs,
            "p50_over_unloaded": {k: v["p50_s"] / runs["unloaded"]["p50_s"] for k, v in runs.items()},
            "p99_over_unloaded": {k: v["p99_s"] / base for k, v in runs.items()}}


def plot_lanes_testbed(result: dict[str, Any], path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["runs"])
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, q in enumerate(("p50_s", "p99_s")):
        ax.bar([j + 0.38 * i for j in range(len(names))], [result["runs"][n][q] * 1e3 for n in names], 0.38, label=q[:3])
    ax.set_xticks([j + 0.19 for j in range(len(names))], [n.replace("_", " ") for n in names])
    ax.set_ylabel("64 KiB burst, ms")
    ax.set_yscale("log")
    ax.set_title(f"LC bursts across the testbed, CNIC {result['cnic_bytes_per_s'] / 1e6:.0f} MB/s")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
