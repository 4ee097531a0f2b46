"""The emulated KV flows of bench tp-lanes (deploy/testbed/tp_lanes_bench.py): the zero-copy source sends its
file's bytes over and over, the sink drains until its peer closes; on loopback, no root."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from dualpath.deploy.testbed.tp_lanes_bench import _SINK, _ZERO_COPY_SOURCE, SINK_LOWAT_BYTES

FILE_BYTES = 1 << 20  # small, so that 3.5 of them show the source wrapping round its file


def test_the_zero_copy_source_repeats_its_file():
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    src = subprocess.Popen([sys.executable, "-c", _ZERO_COPY_SOURCE, "127.0.0.1", str(port), str(FILE_BYTES)],
                           stderr=subprocess.DEVNULL)
    try:
        srv.settimeout(20)
        conn, _ = srv.accept()
        conn.settimeout(20)
        got, want = bytearray(), int(3.5 * FILE_BYTES)
        while len(got) < want:
            chunk = conn.recv(1 << 16)
            assert chunk, "the source closed early"
            got += chunk
        assert got[:want] == b"\xa5" * want  # the file's bytes, past its end: sendfile(2) started again at 0
    finally:
        src.kill()
        src.wait()
        srv.close()


def test_the_sink_drains_with_a_low_water_mark_and_ends_when_its_peer_closes():
    sink = subprocess.Popen([sys.executable, "-c", _SINK, "127.0.0.1", "0", str(SINK_LOWAT_BYTES)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert sink.stdout.readline().strip() == "ready"
        # port 0 bound the sink to a port we cannot see from here: find it from /proc/net/tcp
        port = _listening_port(sink.pid)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(b"\x01" * (3 * SINK_LOWAT_BYTES + 123))  # not a multiple of the low-water mark
        assert sink.wait(20) == 0  # drained it all (MSG_TRUNC), then read the close
    finally:
        if sink.poll() is None:
            sink.kill()
            sink.wait()


def _listening_port(pid: int) -> int:
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")}
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and f[9] in inodes:  # LISTEN
            return int(f[1].split(":")[1], 16)
    raise AssertionError("the sink is not listening")
