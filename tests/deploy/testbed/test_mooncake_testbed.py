"""Mooncake Transfer Engine across two testbed hosts (root): the bytes land intact in the peer's
registered buffer over the CNIC link, and its unmarked TCP traffic rides the link's default
class, the KV lane's, not the latency-critical one."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from dualpath.deploy.testbed.plan import plan_testbed
from dualpath.runtime.transport.mooncake import mooncake_loads

MB = 1e6
PAYLOAD_BYTES = 3_000_000  # 0.3 s at the CNIC's 10 MB/s below: long enough to be counted, short for a test
SEED = 7

# Each side in its host's namespace: start a Mooncake engine at its CNIC address, print its address
# (receiver) or write into the peer's (sender), as an engine does (transport/mooncake.py).
_RECEIVER = r"""
import hashlib, sys
import numpy as np
from dualpath.runtime.transport.mooncake import MooncakeTransfer
t = MooncakeTransfer.start(sys.argv[1])
buf = np.zeros(int(sys.argv[2]), dtype=np.uint8)
t.register("buffer", buf)
print(t.address().to_text(), flush=True)
sys.stdin.readline()  # the sender is done
print(hashlib.sha256(buf.tobytes()).hexdigest(), flush=True)
"""

_SENDER = r"""
import sys
import numpy as np
from dualpath.runtime.transport.mooncake import MooncakeAddress, MooncakeTransfer, address_of
t = MooncakeTransfer.start(sys.argv[1])
peer = MooncakeAddress.from_text(sys.argv[2])
src = np.random.default_rng(int(sys.argv[4])).integers(0, 256, int(sys.argv[3]), dtype=np.uint8)
half = src.nbytes // 2  # two pieces, as a span copy writes a layer's block slices
t.write(peer, [(address_of(src), "buffer", 0, half), (address_of(src) + half, "buffer", half, src.nbytes - half)])
"""


@pytest.mark.testbed_root
@pytest.mark.skipif(not mooncake_loads(), reason="Mooncake Transfer Engine does not load here")
def test_mooncake_writes_land_intact_across_hosts_in_the_kv_class(tmp_path, monkeypatch):
    from dualpath.deploy.testbed.netns import class_bytes, down, up

    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    plan = plan_testbed(f"m{os.getpid() % 10000}", 1, 1, 2 * MB, 10 * MB, run_index=251)
    up(plan)
    rx = None
    try:
        p0, d0 = plan.hosts
        cnic = next(link for link in plan.links if link.name == "cnic" and link.host == p0)
        sender_dev = cnic.b_if if cnic.b_ns == p0 else cnic.a_if
        ip = {h: plan.cnic_addr_of[h] for h in plan.hosts}
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        rx = subprocess.Popen(["ip", "netns", "exec", d0, sys.executable, "-c", _RECEIVER, ip[d0], str(PAYLOAD_BYTES)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        address = rx.stdout.readline().strip()
        before = class_bytes(p0, sender_dev)
        subprocess.run(["ip", "netns", "exec", p0, sys.executable, "-c", _SENDER, ip[p0], address, str(PAYLOAD_BYTES),
                        str(SEED)], check=True, timeout=60, env=env)
        after = class_bytes(p0, sender_dev)
        digest, _ = rx.communicate("done\n", timeout=60)
        import numpy as np

        want = np.random.default_rng(SEED).integers(0, 256, PAYLOAD_BYTES, dtype=np.uint8)
        assert digest.strip() == hashlib.sha256(want.tobytes()).hexdigest()  # every byte where it was written
        kv, lc = after[20] - before[20], after[10] - before[10]
        assert kv >= PAYLOAD_BYTES  # the payload (and its headers) in the KV class
        assert lc < 0.01 * PAYLOAD_BYTES  # nothing of it in the latency-critical class
    finally:
        if rx is not None and rx.poll() is None:
            rx.kill()
            rx.wait()
        down(plan.run_id)
