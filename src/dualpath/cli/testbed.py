"""`dualpath testbed up | down | status`: emulated hosts with kernel-enforced links (testbed/)."""

from __future__ import annotations

import json
import os
from typing import Annotated, Optional

import typer

from ..config import parse_mode
from ..errors import InputError
from .io import console, out

MB = 1e6


def _default_id() -> str:
    return f"{os.getpid() % 100000}"  # unique among runs alive on this machine


def up(
    pd: Annotated[str, typer.Option(help="prefill and decode hosts, e.g. 1P1D")] = "1P1D",
    snic_mb_s: Annotated[float, typer.Option(help="each node's SNIC, MB/s per direction (the demo derives its own)")] = 50.0,
    cnic_mb_s: Annotated[float, typer.Option(help="each node's CNIC, MB/s per direction (the demo's rule: 8x SNIC)")] = 400.0,
    run_id: Annotated[Optional[str], typer.Option("--id", help="1-5 lowercase letters or digits (default: from the PID)")] = None,
    index: Annotated[int, typer.Option(help="address block 0-255: 10.231.INDEX.0/24 (SNICs), 10.232.INDEX.0/24 (CNICs)")] = 0,
) -> None:
    """Create the namespaces, veth links, HTB rates and lane classes of one testbed (needs root)."""
    from ..config import parse_pd
    from ..deploy.testbed.netns import up as testbed_up
    from ..deploy.testbed.plan import plan_testbed

    p, d = parse_pd(pd)
    plan = plan_testbed(run_id or _default_id(), p, d, snic_mb_s * MB, cnic_mb_s * MB, index)
    state = testbed_up(plan)
    for host, role in zip(plan.hosts, plan.roles):
        out.print(f"{host}: {role}, SNIC {plan.storage_addr_of[host]} (storage side), CNIC {plan.cnic_addr_of[host]}")
    console.print(f"testbed {plan.run_id} up: {len(plan.namespaces)} namespaces, {len(plan.links)} links; state {state}")


def down(
    run_id: Annotated[Optional[str], typer.Option("--id", help="the testbed to remove")] = None,
    all_: Annotated[bool, typer.Option("--all", help="remove every testbed with a state file")] = False,
) -> None:
    """Delete a testbed's namespaces (and with them every link and qdisc it made)."""
    from ..deploy.testbed.netns import down as testbed_down, running

    if (run_id is None) == (not all_):
        raise InputError("give exactly one of --id ID and --all")
    ids = sorted(running()) if all_ else [run_id]
    for rid in ids:
        removed = testbed_down(rid)
        console.print(f"testbed {rid} down: removed {len(removed)} namespaces")


def status(as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False) -> None:
    """Testbeds that are up, with the bytes the kernel counted per link end and lane class."""
    from ..deploy.testbed.netns import check_can_run, link_counters, running

    check_can_run()
    report = {rid: {"hosts": plan["hosts"], "links": link_counters(plan)} for rid, plan in running().items()}
    if as_json:
        out.print_json(json.dumps(report))
        return
    if not report:
        out.print("no testbed is up")
    for rid, r in report.items():
        out.print(f"testbed {rid}: hosts {', '.join(r['hosts'])}")
        for row in r["links"]:
            out.print(f"  {row['link']} {row['ns']}/{row['dev']}: tx {row['tx_bytes']} B, rx {row['rx_bytes']} B, "
                      f"classes LC {row['lc_class_bytes']} B, KV {row['kv_class_bytes']} B")


def lanes_bench(cnic_mb_s: float, bursts: int, json_path, plot, bulk: str = "tcp") -> None:
    """`bench lanes --testbed` (deploy/testbed/lanes_bench.py): bursts unloaded, beside KV with the two
    classes, and with one class."""
    from ..deploy.testbed.lanes_bench import plot_lanes_testbed, run_lanes_testbed
    from ..sim.runner import write_json
    from ..deploy.testbed.netns import check_can_run

    if bulk not in ("tcp", "mooncake"):
        raise InputError(f"--bulk must be tcp or mooncake, got {bulk!r}")
    check_can_run()
    if cnic_mb_s <= 0 or bursts < 10:
        raise InputError("--cnic-mb-s must be positive and --bursts at least 10")
    if bulk == "mooncake":
        from ..runtime.transport.mooncake import require_mooncake

        require_mooncake()
    r = run_lanes_testbed(cnic_mb_s * MB, bursts, bulk=bulk)
    out.print(f"64 KiB latency-critical bursts every 5 ms over a {cnic_mb_s:.0f} MB/s CNIC (wire time "
              f"{r['wire_time_s'] * 1e3:.2f} ms), two shaped hops, the KV load by {bulk}:")
    for name, s in r["runs"].items():
        out.print(f"  {name:12s} p50 {s['p50_s'] * 1e3:7.2f} ms  p99 {s['p99_s'] * 1e3:7.2f} ms  "
                  f"(x{r['p50_over_unloaded'][name]:.2f} / x{r['p99_over_unloaded'][name]:.2f} of unloaded)")
    c = r["de_port_class_bytes"]
    out.print(f"  the DE host's port, unloaded and two-class runs: LC class {c['lc'] / MB:.1f} MB, KV class {c['kv'] / MB:.1f} MB")
    if json_path:
        write_json(r, json_path)
        console.print(f"wrote {json_path}")
    if plot:
        plot_lanes_testbed(r, plot)
        console.print(f"wrote {plot}")


def testbed_demo(json_path, plot, model: str, snic_mb_s: Optional[float], agents: int, rounds: Optional[int],
                 seed: int, device: str, ray: bool = False, tp: int = 1, transfer: str = "remote-write") -> None:
    """`demo --testbed` (deploy/testbed/demo.py): the demo across emulated hosts, the kernel's counters
    beside the runtime's ledger, the tokens beside a single-host run's."""
    from ..sim.runner import write_json
    from ..deploy.testbed.demo import check_result, collectives_vs_kernel, ledger_vs_kernel, run_testbed_demo
    from .results import print_runs

    result = run_testbed_demo(model, agents, rounds, None if snic_mb_s is None else snic_mb_s * MB, seed, device,
                              run_id=_default_id(), log=console.print, ray=ray, tp=tp, transfer=transfer)
    r = result["config"]["rates"]
    print_runs(result, f"testbed 1P1D{', tp=2' if tp > 1 else ''}, {model}, KV by {transfer}, SNIC {r['snic_bytes_per_s'] / MB:.1f} MB/s per node (tc)", MB, "MB")
    rows = result["ledger_vs_kernel"] = ledger_vs_kernel(result)
    out.print("bytes per link: the runtime's ledger (+ the block files' headers on reads) and the kernel's interface counters")
    for row in rows:
        ratio = "" if row["kernel_over_stated"] is None else f"x{row['kernel_over_stated']:.3f}"
        out.print(f"  {row['mode']:9s} {row['host']:10s} {row['what']:30s} runtime {row['runtime_bytes'] / MB:9.2f} MB"
                  f" (+ headers {row['stated_bytes'] / MB:9.2f})  kernel {row['kernel_bytes'] / MB:9.2f} MB  {ratio}")
    if tp > 1:
        result["collectives_vs_kernel"] = collectives_vs_kernel(result)
        out.print("tensor-parallel collectives: the engine's LC lane bytes (rank 0's tensors) and the kernel's on rank 1's port")
        for row in result["collectives_vs_kernel"]:
            out.print(f"  {row['mode']:9s} {row['host']:10s} runtime {row['runtime_lc_bytes'] / MB:9.2f} MB  kernel: rank 0 -> 1"
                      f" {row['kernel_rank0_to_rank1_bytes'] / MB:9.2f} MB, 1 -> 0 {row['kernel_rank1_to_rank0_bytes'] / MB:9.2f} MB;"
                      f" classes LC {row['kernel_lc_class_bytes'] / MB:9.2f} MB, KV {row['kernel_kv_class_bytes'] / MB:6.2f} MB")
    runs = {x["mode"]: x for x in result["runs"]}
    same = all(x["tokens_sha256"] == result["reference_tokens_sha256"] for x in result["runs"])
    out.print(f"tokens: {'identical to' if same else 'DIFFERENT from'} the single-host run in both modes")
    out.print(f"JCT dualpath / basic = {runs['dualpath']['jct_s'] / runs['basic']['jct_s']:.2f}")
    restart = (result.get("ray") or {}).get("restart")
    if restart:
        out.print(f"Ray restart: decode actor pid {restart['before']['pid']} killed (kill -9) -> pid {restart['after']['pid']}; "
                  f"its request {'completed with' if restart['in_flight_same'] else 'did NOT end with'} the baseline's tokens "
                  f"{restart['in_flight_s']:.1f} s after the kill, the next one "
                  f"{'served with' if restart['next_same'] else 'did NOT get'} them ({restart['next_done_s']:.1f} s)")
    result["failed_checks"] = check_result(result)
    if json_path:
        write_json(result, json_path)
        console.print(f"wrote {json_path}")
    if plot:
        from ..metrics.plots import plot_runs

        plot_runs(result, plot, f"dualpath demo on the testbed: {model}", bytes_scale=MB, bytes_unit="MB")
        console.print(f"wrote {plot}")


def testbed_run(trace, model: str, pd: str, modes: list[str], limit: int, max_len: int, time_scale: float,
                snic_mb_s: float, device: str, json_path, transfer: str = "remote-write") -> None:
    """`run TRACE --testbed` (deploy/testbed/run.py): the replay across emulated hosts, the
    kernel's counters beside the runtime's ledger, the tokens beside a single-host run's."""
    from ..deploy.testbed.demo import ledger_vs_kernel
    from ..deploy.testbed.run import run_testbed_trace
    from ..sim.runner import write_json
    from .results import RUNTIME_COLUMNS, print_runs

    for m in modes:
        parse_mode(m)  # an unknown mode: one line before any namespace exists
    result = run_testbed_trace(trace, model, pd, modes, limit, max_len, time_scale, snic_mb_s, device,
                               run_id=_default_id(), log=console.print, transfer=transfer)
    print_runs(result, f"replay of {trace.name} on the testbed {pd}, SNIC {snic_mb_s:.1f} MB/s per node (tc)", MB, "MB",
               RUNTIME_COLUMNS)
    rows = result["ledger_vs_kernel"] = ledger_vs_kernel(result)
    for row in rows:
        ratio = "" if row["kernel_over_stated"] is None else f"x{row['kernel_over_stated']:.3f}"
        out.print(f"  {row['mode']:9s} {row['host']:10s} {row['what']:30s} runtime {row['runtime_bytes'] / MB:9.2f} MB"
                  f" (+ headers {row['stated_bytes'] / MB:9.2f})  kernel {row['kernel_bytes'] / MB:9.2f} MB  {ratio}")
    same = [x["mode"] for x in result["runs"] if x["tokens_sha256"] == result["reference_tokens_sha256"]]
    out.print(f"tokens identical to the single-host run: {', '.join(same) or 'none'} of {', '.join(modes)}")
    if json_path:
        write_json(result, json_path)
        console.print(f"wrote {json_path}")
