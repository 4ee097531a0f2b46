"""Ray nodes on the testbed: one Ray node per emulated host, so Ray's placement and the kernel's
links are both real (`dualpath demo --testbed --ray`).

1. The plan has a management network (deploy/testbed/plan.py `mgmt=True`): an unshaped bridge with a
   port on every host, so Ray's own traffic (GCS, raylets, object transfers) rides neither the
   shaped SNIC/CNIC links nor their classes.
2. The head runs in the router host's namespace (`ray start --head --num-cpus 0`, at the router
   host's management address): the driver there joins it, and no engine can land on it.
3. One worker per node host: `ip netns exec HOST taskset -c CPUS ray start --address HEAD
   --node-ip-address MGMT_IP --num-cpus 1 --resources '{"dp_prefill": 1}'` (or dp_decode): an
   actor that asks for that resource runs inside that namespace (its /proc/self/ns/net), on that
   host's CPUs. The engine actor there listens on the host's CNIC address and reads through its
   SNIC link (deploy/ray/engines.py: NodeAddresses), as `dualpath engine` does in `demo --testbed`.
4. The cluster has an auth token and a temp dir of its own (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN;
   `--temp-dir`), so it never meets another Ray on this machine (~/.ray's token, /tmp/ray).
5. Stop: each `ray start --block` is ended through its process group (SIGTERM, then SIGKILL), then
   every process still in the run's namespaces (`ip netns pids`: ours by construction) is killed.
   Never `ray stop`: it ends every Ray process on the machine, other people's too.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ...errors import InputError
from ..testbed import netns
from ..testbed.plan import TestbedPlan
from .engines import ROLE_RESOURCE

HEAD_PORT = 6379  # Ray's default GCS port, inside the router host's namespace (ours alone)
# A node's object store: engines pass no objects through Ray (KV rides our own links), so Ray's
# minimum (75 MiB, ray 2.60.0) plus room for its own bookkeeping; its default is 30% of RAM per node.
OBJECT_STORE_BYTES = 96 * 2**20
UP_LINE = "This command will now block forever"  # `ray start --block` (ray 2.60.0): its node is registered
NODE_START_TIMEOUT_S = 120.0  # one `ray start`: ~5 s on the 2-core VM; Ray itself gives a raylet 30 s to register
NODES_TIMEOUT_S = 90.0  # every worker registered with the head: ~5 s each on the 2-core VM
STOP_GRACE_S = 10.0  # a `ray start --block` ends its raylet and workers on SIGTERM within seconds


def _ray_bin() -> str:
    found = Path(sys.executable).with_name("ray")
    return str(found) if found.exists() else (shutil.which("ray") or "ray")


class RayNodes:
    """A Ray cluster over a testbed's hosts (module docstring)."""

    def __init__(self, plan: TestbedPlan, cpus: dict[int, tuple[int, ...]], log_dir: Path) -> None:
        if not plan.mgmt_bridge or not plan.router_ns:
            raise InputError("Ray nodes on the testbed need its management network and router host (plan_testbed(mgmt=True, router=True))")
        self.plan, self.cpus, self.log_dir = plan, cpus, log_dir
        self.temp_dir = tempfile.mkdtemp(prefix="dpray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_USAGE_STATS_ENABLED": "0", "PYTHONUNBUFFERED": "1"}
        self.head_address = f"{plan.mgmt_addr_of[plan.router_ns]}:{HEAD_PORT}"
        self.procs: list[subprocess.Popen] = []

    def _start(self, ns: str, args: list[str], log_name: str, cpus: tuple[int, ...] = ()) -> None:
        pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
        common = ["--block", "--temp-dir", self.temp_dir, "--object-store-memory", str(OBJECT_STORE_BYTES),
                  "--disable-usage-stats"]
        log = self.log_dir / log_name
        with open(log, "w") as f:
            self.procs.append(subprocess.Popen(["ip", "netns", "exec", ns, *pin, _ray_bin(), "start", *args, *common],
                                               stdout=f, stderr=subprocess.STDOUT, env=self.env, start_new_session=True))
        deadline = time.monotonic() + NODE_START_TIMEOUT_S
        while UP_LINE not in log.read_text(errors="replace"):
            if self.procs[-1].poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise InputError(f"testbed: the Ray node in {ns} did not start: {tail[0][:300]}")
            time.sleep(0.2)

    def start(self) -> None:
        """The head, then each worker, one at a time: each `ray start` is waited for until its node
        is up (on 2 busy cores, workers started together with the head timed out registering)."""
        plan = self.plan
        self._start(plan.router_ns, ["--head", "--port", str(HEAD_PORT), "--node-ip-address", plan.mgmt_addr_of[plan.router_ns],
                                     "--num-cpus", "0", "--include-dashboard=false"], "ray-head.log")
        for e, (host, role) in enumerate(zip(plan.hosts, plan.roles)):
            self._start(host, ["--address", self.head_address, "--node-ip-address", plan.mgmt_addr_of[host], "--num-cpus", "1",
                               "--resources", json.dumps({ROLE_RESOURCE[role]: 1})], f"ray-node{e}.log", self.cpus.get(e, ()))

    def wait_joined(self, timeout_s: float = NODES_TIMEOUT_S) -> None:
        """Until every node has joined the head (a driver in the router host asks Ray), or an InputError."""
        code = (f"import ray; from dualpath.deploy.ray.testbed import wait_for_nodes; "
                f"ray.init(address={self.head_address!r}, log_to_driver=False, logging_level='ERROR'); "
                f"wait_for_nodes(ray, {1 + len(self.plan.hosts)}, {timeout_s})")
        p = subprocess.run(["ip", "netns", "exec", self.plan.router_ns, sys.executable, "-c", code], env=self.env,
                           capture_output=True, text=True, timeout=timeout_s + 60)
        if p.returncode != 0:
            raise InputError(f"the testbed's Ray nodes did not all join: {(p.stderr.strip().splitlines() or ['?'])[-1][:300]}")

    def driver_spec(self) -> dict:
        """What a driver needs to join (deploy/ray/driver.py): the head, the node count, the cluster's token
        (the spec file lies in the run's 0700 work directory, beside the peers' token)."""
        return {"address": self.head_address, "nodes": 1 + len(self.plan.hosts), "auth_token": self.env["RAY_AUTH_TOKEN"]}

    def namespaces(self) -> tuple[str, ...]:
        return (self.plan.router_ns, *self.plan.hosts)

    def stop(self) -> list[str]:
        """End every process this cluster started; the command lines of those that needed SIGKILL
        after the grace (stragglers, e.g. workers a raylet left)."""
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)  # its own session (start_new_session): only our processes
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)
        killed = []
        for ns in self.namespaces():
            for pid in pids_in(ns):
                killed.append(_cmdline(pid))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.temp_dir, ignore_errors=True)
        return killed


def pids_in(ns: str) -> list[int]:
    """Processes in network namespace `ns` (`ip netns pids`); [] if it is gone."""
    p = netns.run_command(["ip", "netns", "pids", ns], check=False)
    return [int(x) for x in p.stdout.split()] if p.returncode == 0 else []


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return str(pid)


def wait_for_nodes(ray: Any, count: int, timeout_s: float = NODES_TIMEOUT_S) -> None:
    """Until `count` live nodes have joined the head, or an InputError naming how many did."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [n for n in ray.nodes() if n.get("Alive")]
        if len(alive) >= count:
            return
        if time.monotonic() > deadline:
            raise InputError(f"only {len(alive)} of {count} Ray nodes joined the head within {timeout_s:.0f} s")
        time.sleep(0.5)


def node_addresses(plan: TestbedPlan, store_url: Any) -> dict[str, tuple[str, str]]:
    """Ray node address (management IP) -> (its CNIC address, its URL of the storage service)."""
    return {plan.mgmt_addr_of[h]: (plan.cnic_addr_of[h], store_url(h)) for h in plan.hosts}
