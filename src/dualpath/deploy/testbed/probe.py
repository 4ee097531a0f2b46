"""One TCP transfer between two testbed namespaces, timed by the receiver: what the kernel's rates
and classes do to real packets (tests, `bench lanes --testbed`). Traffic goes only to the
testbed's own addresses."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

PROBE_PORT = 7411  # any free port inside the namespace; nothing else listens there
PROBE_TIMEOUT_S = 60.0

_RECEIVER = r"""
import json, socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("ready", flush=True)
c, _ = s.accept()
buf = bytearray(1 << 20); n = 0; first = None
while True:
    k = c.recv_into(buf)
    if not k:
        break
    if first is None:
        first = time.perf_counter()
    n += k
print(json.dumps({"bytes": n, "seconds": time.perf_counter() - (first or time.perf_counter())}), flush=True)
"""

_SENDER = r"""
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
c.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, int(sys.argv[4]) << 2)
block = b"\x5a" * (1 << 20); left = int(sys.argv[3])
while left > 0:
    left -= c.send(block[: min(left, len(block))])
c.close()
"""


@dataclass(frozen=True, slots=True)
class Transfer:
    payload_bytes: int
    seconds: float  # first byte to the sender's close, at the receiver

    @property
    def bytes_per_s(self) -> float:
        return self.payload_bytes / self.seconds if self.seconds > 0 else float("inf")


def transfer(src_ns: str, dst_ns: str, dst_addr: str, nbytes: int, dscp: int = 8, port: int = PROBE_PORT) -> Transfer:
    """Send `nbytes` from a process in `src_ns` to one listening on `dst_addr` in `dst_ns`, with
    the DSCP mark `dscp` (8: the KV lane's CS1; 46: the latency-critical lane's EF)."""
    exe = sys.executable
    rx = subprocess.Popen(["ip", "netns", "exec", dst_ns, exe, "-c", _RECEIVER, dst_addr, str(port)],
                          stdout=subprocess.PIPE, text=True)
    try:
        assert rx.stdout is not None
        if rx.stdout.readline().strip() != "ready":
            raise RuntimeError(f"probe receiver in {dst_ns} did not start")
        subprocess.run(["ip", "netns", "exec", src_ns, exe, "-c", _SENDER, dst_addr, str(port), str(nbytes), str(dscp)],
                       check=True, timeout=PROBE_TIMEOUT_S)
        line, _ = rx.communicate(timeout=PROBE_TIMEOUT_S)
    finally:
        if rx.poll() is None:
            rx.kill()
            rx.wait()
    r = json.loads(line)
    return Transfer(int(r["bytes"]), float(r["seconds"]))
