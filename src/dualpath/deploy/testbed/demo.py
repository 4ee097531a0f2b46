"""`dualpath demo --testbed`: the demo across emulated hosts, every rate enforced by the kernel.

1. Plan as the demo does (runtime/apps/demo.py `plan_demo`: this machine's profile gives the SNIC
   rate and the rounds; the CNIC runs at 8x).
2. `testbed up` 1P1D with a router host (plan.py): each node's SNIC link to the storage host at the
   SNIC rate, its CNIC port on the fabric at the CNIC rate, HTB with the two lanes by DSCP. No
   token bucket runs in any process: the runtime's rates are None.
3. Per mode, on a fresh store: the storage service in the storage host's namespace (listening on
   every SNIC link); the driver (router + workload, deploy/testbed/driver.py) in the router host; one
   `dualpath engine` in each node's namespace, pinned to its CPU set, reading blocks through its own
   SNIC link and writing KV to its peer through the fabric (engine/peers.py).
4. The kernel's byte counters of every link end, before and after each mode, beside the runtime's
   ledger (what each engine read, persisted and wrote into its peer).
5. The tokens: both modes' digests (replay.tokens_sha256) must equal a single-host run's of the same
   workload (a local 1P1D cluster at real speed, one process per engine, run first).
6. `tp=2`: each engine's rank 1 on an emulated host of its own (deploy/testbed/tp_hosts.py), its gloo
   collectives in the latency-critical class by u32 filters; the CNIC rows then leave out what
   rank 1's port received, and the rank pair's bytes are reported beside the runtime's collectives.
`down` in every case.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from ...errors import InputError
from . import netns
from .plan import TestbedPlan, plan_testbed
from .tp_hosts import tp_filter_commands, tp_host_of, with_tp_hosts
from ..ray.testbed import RayNodes, node_addresses

STORE_PORT = 7400  # the storage service on the storage host (any free port would do: a namespace of our own)
ROUTER_PORT = 7100  # the router's --engines-listen port on the router host
RUN_TIMEOUT_S = 900.0  # one mode: the demo is sized to ~70 s of basic JCT (demo.TARGET_BASIC_JCT_S) + start-up


def spawn_in(ns: str, args: list[str], log: Path, cpus: tuple[int, ...] = ()) -> subprocess.Popen:
    pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as f:
        return subprocess.Popen(["ip", "netns", "exec", ns, *pin, sys.executable, *args], stdout=f,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_line(log: Path, text: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[3]} exited ({proc.returncode}) before {text!r}: {log.read_text()[-2000:]}")
        time.sleep(0.05)
    raise RuntimeError(f"no {text!r} from {proc.args[3]} within {timeout_s:.0f} s")


def stop_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def _delta(before: list[dict], after: list[dict]) -> list[dict]:
    out = []
    for b, a in zip(before, after):
        row = dict(a)
        for k in ("tx_bytes", "rx_bytes", "tx_packets", "lc_class_bytes", "kv_class_bytes"):
            if k in a:
                row[k] = a[k] - b[k]
        out.append(row)
    return out


@contextlib.contextmanager
def work_dir() -> Iterator[tuple[Path, Path]]:
    """A private temporary directory for a run's logs and stores, and in it the shared token file
    every process of the run authenticates with (transport/peer_auth.py)."""
    with tempfile.TemporaryDirectory(prefix="dp-testbed-") as tmp:
        work = Path(tmp)
        os.chmod(work, 0o700)
        token = work / "token"
        token.write_text(secrets.token_hex(32))
        yield work, token


def run_mode(plan: TestbedPlan, mode: str, spec: dict, work: Path, cpus: dict[int, tuple[int, ...]],
             threads: dict[int, int], ray: dict | None = None, label: str = "") -> dict:
    """One mode on a fresh store: service, driver, engines; the driver's result and the links' bytes.
    `ray` (the Ray cluster's address and node count, deploy/ray/testbed.py): the engines are Ray actors on
    the hosts' Ray nodes, placed by the driver, instead of processes started here. `label` names
    the run's files (default: the mode)."""
    name = label or mode
    token = spec["token_file"]
    store_dir = work / f"store-{name}"
    store_dir.mkdir()
    procs: list[subprocess.Popen] = []
    try:
        store = spawn_in(plan.storage_ns, ["-m", "dualpath.cli", "store", "serve", "--dir", str(store_dir), "--listen",
                                         f"0.0.0.0:{STORE_PORT}", "--token-file", token], work / f"store-{name}.log")
        procs.append(store)
        wait_line(work / f"store-{name}.log", "listening on", store, 60)
        before = netns.link_counters(plan)
        tcp_before = {ns: netns.tcp_counters(ns) for ns in (plan.storage_ns, *plan.hosts)}
        router_ip = plan.cnic_addr_of[plan.router_ns]
        url = lambda host: f"tcp://{plan.storage_addr_of[host]}:{STORE_PORT}?token_file={token}"
        spec = {**spec, "mode": mode, "listen": f"tcp://{router_ip}:{ROUTER_PORT}", "store_url": url(plan.router_ns)}
        if ray is not None:
            spec["ray"] = {**ray, "addresses": node_addresses(plan, url), "threads": max(threads.values())}
        (work / f"spec-{name}.json").write_text(json.dumps(spec))
        out = work / f"result-{name}.json"
        driver = spawn_in(plan.router_ns, ["-m", "dualpath.deploy.testbed.driver", str(work / f"spec-{name}.json"), str(out)],
                        work / f"driver-{name}.log")
        procs.append(driver)
        for e, (host, role) in enumerate(zip(plan.hosts, plan.roles) if ray is None else ()):
            procs.append(spawn_in(host, ["-m", "dualpath.cli", "engine", "--router", spec["listen"], "--role", role,
                                       "--token-file", token, "--listen", plan.cnic_addr_of[host], "--store", url(host),
                                       "--threads", str(threads[e]), *_tp_args(plan, host, spec.get("tp", 1))],
                                  work / f"engine{e}-{name}.log", cpus[e]))
        try:
            rc = driver.wait(RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"the {mode} run did not finish within {RUN_TIMEOUT_S:.0f} s") from None
        if rc != 0:
            raise RuntimeError(f"the {mode} driver failed ({rc}): {(work / f'driver-{name}.log').read_text()[-3000:]}")
        for p in procs[2:]:
            p.wait(30)  # engines end on the cluster's Stop
        result = json.loads(out.read_text())
        result["links"] = _delta(before, netns.link_counters(plan))
        # per host (and the storage host): TCP segments sent and retransmitted during the run
        result["tcp"] = {ns: {k: v - tcp_before[ns][k] for k, v in netns.tcp_counters(ns).items()} for ns in tcp_before}
        return result
    finally:
        stop_all(procs)


def _tp_args(plan: TestbedPlan, host: str, tp: int) -> list[str]:
    """`dualpath engine`'s flags that start its rank 1 on the host's rank-1 host (module doc, 6)."""
    if tp == 1:
        return []
    peer = tp_host_of(host)
    return ["--tp", str(tp), "--tp-peer-host", plan.cnic_addr_of[peer], "--tp-peer-netns", peer]


def single_host_reference(model: str, agents: int, rounds: int, seed: int, device: str) -> str:
    """The tokens digest of the same workload on a local 1P1D cluster at real speed."""
    from ...runtime.cluster import LocalCluster
    from ...runtime.apps.demo import demo_config, demo_workload, run_workload

    async def go() -> str:
        cfg = replace(demo_config("dualpath", None, model), seed=seed, device=device)
        async with LocalCluster(cfg) as c:
            return (await run_workload(c, demo_workload(agents, rounds)))["tokens_sha256"]

    return asyncio.run(go())


def run_testbed_demo(model: str = "smollm2-135m", agents: int = 4, rounds: int | None = None,
                     snic_bytes_per_s: float | None = None, seed: int = 0, device: str = "cpu", run_id: str = "demo",
                     log: Callable[[str], None] = print, modes: tuple[str, ...] = ("basic", "dualpath"),
                     ray: bool = False, tp: int = 1, transfer: str = "remote-write") -> dict[str, Any]:
    """`ray`: one Ray node per host on the plan's management network (deploy/ray/testbed.py), engines as
    Ray actors; after the modes, the restart check (deploy/ray/driver.py) on a cluster of its own.
    `tp`: ranks per engine (module doc, 6); the reference stays one process per engine. `transfer`:
    who moves KV between the hosts (transport.transfer: remote-write, or mooncake, whose TCP
    connections carry no DSCP mark and so fall in each link's default class, the KV lane's)."""
    from ...runtime.engine.cpus import available_cpus, plan_cpus
    from ...runtime.apps.demo import calibrate_for, plan_demo

    if tp > 1 and ray:
        raise InputError("--tp 2 with --ray: not wired (Ray actors run one rank); use --testbed --tp 2 or serve --tp 2")
    netns.check_can_run()
    cal, kv_bytes, bt = calibrate_for(model, device)
    plan_ = plan_demo(cal, kv_bytes, bt, agents, rounds, snic_bytes_per_s)
    rates, num_rounds = plan_.rates, len(plan_.trajectories[0].turns)
    cpu_plan = plan_cpus(range(2), available_cpus(), None)
    log(f"reference: the same workload on one host at real speed ({agents} agents x {num_rounds} rounds)")
    reference = single_host_reference(model, agents, num_rounds, seed, device)
    plan = plan_testbed(run_id, 1, 1, rates.snic_bytes_per_s, rates.cnic_bytes_per_s, router=True, mgmt=ray)
    if tp > 1:
        plan = with_tp_hosts(plan, plan.hosts)
    netns.up(plan)
    host_netns = {h: f"net:[{os.stat(f'/run/netns/{h}').st_ino}]" for h in plan.hosts}  # as /proc/PID/ns/net reads
    nodes, restart, stragglers = None, None, []
    try:
        for host in plan.hosts if tp > 1 else ():
            for cmd in tp_filter_commands(plan, host):
                netns.run_command(cmd)
        with work_dir() as (work, token):
            spec = {"model": model, "agents": agents, "rounds": num_rounds, "seed": seed, "device": device,
                    "token_file": str(token), "tp": tp, "transfer": transfer}
            runs, cpus, threads = [], cpu_plan.cpus_by_engine, cpu_plan.threads_by_engine
            if ray:
                nodes = RayNodes(plan, cpus, work)
                nodes.start()
                nodes.wait_joined()
            on_ray = nodes.driver_spec() if nodes else None
            for mode in modes:
                log(f"{mode}: across the testbed's hosts (SNIC {rates.snic_bytes_per_s / 1e6:.1f} MB/s, "
                    f"CNIC {rates.cnic_bytes_per_s / 1e6:.1f} MB/s, enforced by tc){' on Ray' if ray else ''}")
                runs.append(run_mode(plan, mode, spec, work, cpus, threads, on_ray))
            if nodes is not None:
                log("restart check: kill -9 of the decode actor's process mid-request, then the next request")
                restart = run_mode(plan, "dualpath", spec, work, cpus, threads, {**on_ray, "restart_check": True},
                                   "restart")["restart"]
    finally:
        if nodes is not None:
            stragglers = nodes.stop()
        netns.down(plan.run_id)
    return {"config": {"model": model, "pd": "1P1D", "tp": tp, "transfer": transfer, "rates": rates.to_json(), "seed": seed, "device": device,
                       "full_block_bytes": kv_bytes * bt, "testbed": netns.plan_json(plan)},
            "reference_tokens_sha256": reference, "runs": runs,
            **({"ray": {"restart": restart, "stragglers_killed": stragglers, "host_netns": host_netns}} if ray else {})}


def ledger_vs_kernel(result: dict) -> list[dict]:
    """Per run and node: what the runtime says crossed each link, what the kernel counted (headers
    included: TCP/IP, the storage protocol's frames, remote-write frames, control messages), and
    the runtime's bytes plus what else it states: a block read from the service comes as its
    file, header (store/format.py HEADER_BYTES) and payload; the CNIC also carries the engine's
    messages to the router and its peers (Counters.control_bytes, their encoded bytes)."""
    from ...runtime.store.format import HEADER_BYTES

    block, tp = result["config"]["full_block_bytes"], result["config"].get("tp", 1)
    rows = []
    for r in result["runs"]:
        links = {(x["link"], x["host"], x["dev"]): x for x in r["links"]}
        for e, host in enumerate(result["config"]["testbed"]["hosts"]):
            led = r["ledger"].get(str(e), {})
            snic = [x for (name, h, _), x in links.items() if name == "snic" and h == host]
            storage_end = next(x for x in snic if x["dev"] != "snic0")
            node_snic = next(x for x in snic if x["dev"] == "snic0")
            node_cnic = links[("cnic", host, "cnic0")]
            cnic_what, cnic_kernel = "CNIC out (KV to the peer)", node_cnic["tx_bytes"]
            cnic_packets = node_cnic.get("tx_packets")
            if tp > 1:  # rank 1's host talks to rank 0 only: what its port received left the node for it
                cnic_what, cnic_kernel = "CNIC out, less rank 1's (KV to the peer)", cnic_kernel - links[
                    ("cnic", tp_host_of(host), "cnic0")]["rx_bytes"]
            for what, runtime, kernel in (("SNIC read (storage -> node)", led.get("storage_read_bytes", 0), storage_end["tx_bytes"]),
                                          ("SNIC write (node -> storage)", led.get("storage_write_bytes", 0), node_snic["tx_bytes"]),
                                          (cnic_what, led.get("remote_write_bytes", 0), cnic_kernel)):
                stated = runtime + (runtime // block * HEADER_BYTES if what.startswith("SNIC read") else
                                    led.get("control_bytes", 0) if what.startswith("CNIC") else 0)
                rows.append({"mode": r["mode"], "host": host, "what": what, "runtime_bytes": runtime, "kernel_bytes": kernel,
                             "stated_bytes": stated, "kernel_over_stated": kernel / stated if stated else None,
                             # what came in on the port, whose TCP acks leave on it
                             "kernel_in_bytes": node_cnic["rx_bytes"] if what.startswith("CNIC") else None,
                             # the packets the port sent (a GSO burst counted once): bytes per packet
                             "kernel_packets": cnic_packets if what.startswith("CNIC") and tp == 1 else None})
    return rows


# Ethernet 14 + IPv4 20 + TCP 20 + its timestamp option 12 bytes: the headers of every packet on the
# testbed's links (a GSO burst is one packet to the port that counts it)
PACKET_HEADER_BYTES = 66


def cnic_framing_bytes(row: dict) -> int | None:
    """A `ledger_vs_kernel` CNIC row's bytes beyond what the runtime states once one header per
    packet the port sent (data or ack) is taken off: the transport's own framing. None without a
    packet count (not a CNIC row, or tp=2)."""
    if row.get("kernel_packets") is None:
        return None
    return row["kernel_bytes"] - PACKET_HEADER_BYTES * row["kernel_packets"] - row["stated_bytes"]


def collectives_vs_kernel(result: dict) -> list[dict]:
    """tp=2, per run and engine: its LC lane's bytes as it reported them (its rank 0's collectives'
    tensors, engine/tp.py: a broadcast's whole and an all_reduce's share, what rank 0 sends; + LC
    messages on its arbiter) beside what the kernel counted on rank 1's port: bytes each way (gloo's
    framing and TCP/IP included) and, both ways together, the bytes in each class. (A class counts a
    GSO packet as the segments it becomes, a header each; an interface counts it once.)"""
    rows = []
    for r in result["runs"]:
        for e, host in enumerate(result["config"]["testbed"]["hosts"]):
            ends = [x for x in r["links"] if x["link"] == "cnic" and x["host"] == tp_host_of(host)]
            port = next(x for x in ends if x["dev"] == "cnic0")
            rows.append({"mode": r["mode"], "host": host, "runtime_lc_bytes": r["ledger"].get(str(e), {}).get("cnic_lc_bytes", 0),
                         "kernel_rank0_to_rank1_bytes": port["rx_bytes"], "kernel_rank1_to_rank0_bytes": port["tx_bytes"],
                         "kernel_lc_class_bytes": sum(x["lc_class_bytes"] for x in ends),
                         "kernel_kv_class_bytes": sum(x["kv_class_bytes"] for x in ends)})
    return rows


def check_result(result: dict) -> list[str]:
    """What the acceptance asks of a run, as sentences about what failed ([] = all held)."""
    bad = []
    for r in result["runs"]:
        if r["tokens_sha256"] != result["reference_tokens_sha256"]:
            bad.append(f"{r['mode']}: tokens differ from the single-host run")
    if [r["mode"] for r in result["runs"]] == ["basic", "dualpath"]:
        ratio = result["runs"][1]["jct_s"] / result["runs"][0]["jct_s"]
        if ratio > 0.60:
            bad.append(f"JCT dualpath / basic = {ratio:.2f} > 0.60")
    restart = (result.get("ray") or {}).get("restart")
    if "ray" in result and not (restart and restart["in_flight_same"] and restart["next_same"]
                                and restart["before"]["pid"] != restart["after"]["pid"]):
        bad.append("Ray restart: the killed decode actor's request or the next one did not get the baseline's tokens")
    return bad
