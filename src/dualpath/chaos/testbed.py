"""`dualpath chaos --testbed`: the fault matrix (chaos.py) across emulated hosts, as root.

The same scenarios, workload and counting as on one host, with every process in a host of its own
and every rate the kernel's (deploy/testbed/plan.py):
  1. `testbed up` 2P2D with a router host: a storage host, four node hosts, the router's host;
     each node's SNIC link at SNIC_BYTES_PER_S, every CNIC port at chaos.SLOW_CNIC_BYTES_PER_S,
     the rate the local matrix emulates to widen its stream, PD and persist moments (here the
     kernel holds every scenario to it).
  2. The driver (this module's `main`) runs in the router's host. For the reference and then for
     every scenario it starts fresh processes: the storage service in the storage host
     (`dualpath store serve`, reached by each host through its own SNIC link) and one `dualpath
     engine` per node host, each joining the router over the compute network (its log names its
     engine id, so the victim's PID is known). Nothing is shared between hosts but the kernel.
  3. A victim is signalled by its PID. Engines on other hosts are watched by heartbeats only (no
     exit watch sees another host's processes), so a killed engine is found within
     RuntimeConfig.faults.heartbeat_timeout_s, as a frozen one is; the router fences an engine by
     SIGKILL to its PID (a real deployment: the host's agent, or its orchestrator's restart).
`down` in every case. Send traffic only to the testbed's own addresses.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ..config.overrides import set_fields
from ..config.runtime import KvTransfer

from ..deploy.testbed import netns
from ..deploy.testbed.plan import plan_testbed
from .matrix import (SLOW_CNIC_BYTES_PER_S, STORE_VICTIM, STORE_WIDENED, ChaosResult, chaos_config, play_scenario,
                    reference_run, report_config, scenario_config)
from ..deploy.testbed.demo import spawn_in, wait_line, work_dir

# Each node's SNIC link: a turn-2 hit of 3-4 blocks of 64 KiB (tiny model) takes ~30-60 ms to read,
# wide enough for the 1 ms poll of a read moment (chaos.py); 8x below the CNIC would be the demo's
# ratio, but here the CNIC is held low for the other moments. Project choice.
SNIC_BYTES_PER_S = 8e6
RUN_INDEX = 244  # the testbed's address block, apart from the other benches' and tests' (245-251)
STORE_PORT, ROUTER_PORT = 7500, 7600  # + the run's index (reference 0, then 1, 2, ...): no port reused
ENGINE_START_TIMEOUT_S = 180.0  # four `dualpath engine` CLIs start together on a 2-core machine
SCENARIO_TIMEOUT_S = 300.0  # the driver's whole run: this per scenario and for the reference
_JOINED = re.compile(r"as engine (\d+) ")


class ScenarioHosts:
    """One run's processes on the testbed: the storage service and one engine per node host."""

    def __init__(self, spec: dict, label: str, index: int) -> None:
        self.spec, self.label = spec, label
        self.work = Path(spec["work"])
        self.store_port, self.router_port = STORE_PORT + index, ROUTER_PORT + index
        self.service: subprocess.Popen | None = None
        self.started: list[tuple[subprocess.Popen, Path]] = []
        self.engines: dict[int, subprocess.Popen] = {}

    def url(self, host: str) -> str:
        return f"tcp://{self.spec['storage_addr_of'][host]}:{self.store_port}?token_file={self.spec['token_file']}"

    @property
    def listen(self) -> str:
        return f"tcp://{self.spec['cnic_addr_of'][self.spec['router_ns']]}:{self.router_port}"

    def start_service(self) -> None:
        log = self.work / f"store-{self.label}.log"
        store = self.work / f"store-{self.label}"
        store.mkdir()
        self.service = spawn_in(self.spec["storage_ns"], [
            "-m", "dualpath.cli", "store", "serve", "--dir", str(store), "--listen", f"0.0.0.0:{self.store_port}",
            "--token-file", self.spec["token_file"], "--threads", "1"], log)
        wait_line(log, "listening on", self.service, 60)

    def start_engines(self, router_endpoint: str) -> None:
        """LocalCluster.on_router_ready: one `dualpath engine` per node host, joining the router."""
        for k, (host, role) in enumerate(zip(self.spec["hosts"], self.spec["roles"])):
            log = self.work / f"engine{k}-{self.label}.log"
            proc = spawn_in(host, ["-m", "dualpath.cli", "engine", "--router", router_endpoint, "--role", role,
                                   "--token-file", self.spec["token_file"], "--listen", self.spec["cnic_addr_of"][host],
                                   "--store", self.url(host), "--threads", "1"], log)
            self.started.append((proc, log))

    def map_engines(self) -> None:
        """Engine id -> process, from each engine's "joined ... as engine N" line."""
        for proc, log in self.started:
            found = _JOINED.search(log.read_text())
            if found is None:
                raise RuntimeError(f"{log.name}: no 'joined ... as engine N' line: {log.read_text()[-1500:]}")
            self.engines[int(found.group(1))] = proc

    def send(self, victim: int, sig: int) -> None:
        """chaos.Signaller: the victim's process, by PID (another host's, as its agent would)."""
        proc = self.service if victim == STORE_VICTIM else self.engines.get(victim)
        if proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, sig)

    def fence(self, engine: int) -> None:
        self.send(engine, signal.SIGKILL)

    def stop(self) -> None:
        """Engines end on the cluster's Stop; whatever has not within 10 s (or froze) is killed."""
        procs = [p for p, _ in self.started] + ([self.service] if self.service else [])
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
        if self.service is not None and self.service.poll() is None:
            self.service.terminate()
        deadline = time.monotonic() + 10.0
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


@contextlib.asynccontextmanager
async def testbed_cluster(spec: dict, cfg: Any, label: str, index: int) -> AsyncIterator[tuple[Any, ScenarioHosts]]:
    """A fresh storage service and four fresh engines across the hosts, the router here."""
    from ..runtime.cluster import LocalCluster

    hosts = ScenarioHosts(spec, label, index)
    try:
        hosts.start_service()
        cfg = set_fields(cfg, {"store.location": hosts.url(spec["router_ns"])})
        cluster = LocalCluster(cfg, start_timeout_s=ENGINE_START_TIMEOUT_S, engines_listen=hosts.listen,
                               on_router_ready=hosts.start_engines)
        cluster.on_fence = hosts.fence
        async with cluster:
            hosts.map_engines()
            yield cluster, hosts
    finally:
        hosts.stop()


async def drive(spec: dict, emit: Callable[[dict], None]) -> dict:
    """In the router's host: the reference, then every scenario, each on fresh processes."""
    cfg = chaos_config(spec["model"], spec["policy"],
                       changes={"transport.kind": "tcp", "transport.peer_token_file": spec["token_file"],
                                "transport.transfer": KvTransfer(spec.get("transfer", KvTransfer.REMOTE_WRITE))})
    n, gen = spec["num_requests"], spec["gen_tokens"]
    async with testbed_cluster(spec, cfg, "reference", 0) as (cluster, _):
        reference = await reference_run(cluster, n, gen)
    results = []
    for i, name in enumerate(spec["scenarios"], 1):
        async with testbed_cluster(spec, scenario_config(cfg, name, kernel_rates=True), name, i) as (cluster, hosts):
            res = await play_scenario(cluster, hosts.send, name, reference, gen)
        results.append(res.to_json())
        emit(res.to_json())
    widened = {"cnic_bytes_per_s": SLOW_CNIC_BYTES_PER_S, "by": "tc, every scenario", "store": {"read": STORE_WIDENED["read"]}}
    return {"config": {**report_config(cfg, spec, "2P2D"), "widened": widened, "testbed": spec["testbed"]},
            "results": results, "reference": reference}


def run_chaos_testbed(scenarios: list[str], model: str = "tiny", policy: str = "recompute", num_requests: int = 4,
                      gen_tokens: int = 48, on_result: Callable[[ChaosResult], None] | None = None,
                      run_id: str | None = None, log: Callable[[str], None] = print,
                      transfer: str = "remote-write") -> dict:
    """Up, the driver in the router's host (results streamed back as JSON lines), down. `transfer`:
    who moves KV between the hosts (our remote writes, or Mooncake Transfer Engine); the engines
    learn it from the router when they join."""
    netns.check_can_run()
    log("reference on one host: the same two turns on a local 2P2D cluster")
    single = asyncio.run(_single_host_reference(model, policy, num_requests, gen_tokens))
    plan = plan_testbed(run_id or f"c{os.getpid() % 10000}", 2, 2, SNIC_BYTES_PER_S, SLOW_CNIC_BYTES_PER_S,
                        run_index=RUN_INDEX, router=True)
    netns.up(plan)
    try:
        with work_dir() as (work, token):
            spec = {"model": model, "policy": policy, "num_requests": num_requests, "gen_tokens": gen_tokens,
                    "scenarios": scenarios, "transfer": transfer, "work": str(work), "token_file": str(token), "hosts": list(plan.hosts),
                    "roles": list(plan.roles), "storage_ns": plan.storage_ns, "router_ns": plan.router_ns,
                    "storage_addr_of": plan.storage_addr_of, "cnic_addr_of": plan.cnic_addr_of,
                    "testbed": {**netns.plan_json(plan), "snic_bytes_per_s": SNIC_BYTES_PER_S,
                                "cnic_bytes_per_s": SLOW_CNIC_BYTES_PER_S}}
            (work / "spec.json").write_text(json.dumps(spec))
            log(f"testbed {plan.run_id}: 2P2D + router + storage host, SNIC {SNIC_BYTES_PER_S / 1e6:.0f} MB/s, "
                f"CNIC {SLOW_CNIC_BYTES_PER_S / 1e6:.0f} MB/s (tc), KV through {transfer}; the reference, then "
                f"{len(scenarios)} scenario(s)")
            report = _follow(plan.router_ns, work, len(scenarios), on_result)
    finally:
        netns.down(plan.run_id)
    report["reference_equals_single_host"] = report.pop("reference") == single
    return report


async def _single_host_reference(model: str, policy: str, num_requests: int, gen_tokens: int) -> list[list[int]]:
    from ..runtime.cluster import LocalCluster

    async with LocalCluster(chaos_config(model, policy)) as cluster:
        return await reference_run(cluster, num_requests, gen_tokens)


def _follow(router_ns: str, work: Path, num: int, on_result: Callable[[ChaosResult], None] | None) -> dict:
    """Run the driver; hand each result line to `on_result` as it comes; its report at the end."""
    lines, out = work / "results.jsonl", work / "report.json"
    driver = spawn_in(router_ns, ["-m", __name__, str(work / "spec.json"), str(lines), str(out)], work / "driver.log")
    deadline, seen = time.monotonic() + SCENARIO_TIMEOUT_S * (num + 1), 0
    try:
        while driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = _emit_new(lines, seen, on_result)
        if driver.poll() is None:
            raise RuntimeError(f"the chaos driver did not finish within {SCENARIO_TIMEOUT_S * (num + 1):.0f} s")
        _emit_new(lines, seen, on_result)
        if driver.returncode != 0:
            raise RuntimeError(f"the chaos driver failed ({driver.returncode}): {(work / 'driver.log').read_text()[-3000:]}")
        return json.loads(out.read_text())
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(10)


def _emit_new(lines: Path, seen: int, on_result: Callable[[ChaosResult], None] | None) -> int:
    rows = lines.read_text().split("\n")[:-1] if lines.exists() else []  # whole lines only
    for row in rows[seen:]:
        if on_result is not None:
            on_result(ChaosResult(**json.loads(row)))
    return len(rows)


def main(argv: list[str]) -> int:
    spec_path, lines_path, out_path = argv
    spec = json.loads(Path(spec_path).read_text())

    def emit(row: dict) -> None:
        with open(lines_path, "a") as f:
            f.write(json.dumps(row) + "\n")

    report = asyncio.run(drive(spec, emit))
    Path(out_path).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
