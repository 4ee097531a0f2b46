"""`dualpath chaos`: engine faults on a local cluster against a fault-free reference
(chaos/matrix.py)."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ..errors import InputError
from .io import console, out
from .runtime import TransferOption, transfer_overrides


def chaos(
    scenario: Annotated[Optional[list[str]], typer.Option(
        help="VICTIM-SIGNAL-MOMENT, e.g. de-kill-decode, store-stop-read: pe|de|store x kill|term|stop x read|stream|prefill (pe)|"
             "pd (pe, de)|decode (de)|persist (de, store), or all; repeat")] = None,
    model: Annotated[str, typer.Option(help="tiny (seconds per scenario) or smollm2-135m")] = "tiny",
    policy: Annotated[str, typer.Option(help="recompute (migrate to a survivor) | fail (an error to the client)")] = "recompute",
    requests: Annotated[int, typer.Option(help="greedy requests per turn")] = 4,
    gen_tokens: Annotated[int, typer.Option(help="tokens each request generates")] = 48,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the table as JSON here")] = None,
    corruptions: Annotated[int, typer.Option(
        help="instead of the engine faults: inject at least this many KV corruptions (bits flipped in flight on layer "
             "streams and PD transfers, bytes flipped in stored blocks between turns) and count wrong outputs")] = 0,
    torn_writes: Annotated[int, typer.Option(
        help="instead of the engine faults: kill this many store writers with SIGKILL mid-put and count torn blocks "
             "visible after each reopen")] = 0,
    flip_probability: Annotated[float, typer.Option(
        help="with --corruptions: probability per KV block piece sent that one bit flips (RuntimeConfig.faults.kv_corrupt_probability)")] = 0.05,
    testbed: Annotated[bool, typer.Option("--testbed", help="across emulated hosts (root: network namespaces, tc): "
                                          "every process in a host of its own, every rate the kernel's")] = False,
    transfer: TransferOption = "remote-write",
) -> None:
    """Kill, terminate or freeze an engine of a 2P2D cluster, or the storage service it runs against,
    while a request reads, streams layers, prefills, transfers its KV, decodes or persists; print per
    scenario how many requests finished (with the reference's tokens), errored or were lost.
    With --corruptions / --torn-writes: the transfer and storage integrity acceptance instead."""
    if corruptions < 0 or torn_writes < 0 or not 0.0 < flip_probability <= 1.0:
        raise InputError("--corruptions and --torn-writes must be >= 0 and --flip-probability in (0, 1]")
    if (corruptions or torn_writes) and testbed:
        raise InputError("--testbed runs the engine and storage faults; --corruptions and --torn-writes run on one host")
    overrides = _transfer(transfer, bool(corruptions or torn_writes))
    if corruptions or torn_writes:
        return integrity_acceptance(corruptions, torn_writes, model, flip_probability, json_path)
    from ..chaos.matrix import STORE_VICTIM, parse_scenarios, run_chaos

    names = parse_scenarios(scenario)
    if policy not in ("recompute", "fail"):
        raise InputError(f"--policy must be recompute or fail, got {policy!r}")
    if requests <= 0 or gen_tokens <= 0:
        raise InputError("--requests and --gen-tokens must be positive")
    where = ("across the testbed's hosts" if testbed else "on one host") + (f", KV through {transfer}" if overrides else "")
    console.print(f"chaos: {len(names)} scenario(s) on a 2P2D cluster {where} ({model}, policy {policy}), "
                  f"each against a fault-free reference run")
    progress = lambda r: console.print(f"  {r.scenario}: {r.finished}/{r.requests} finished, {r.errored} errored, "
                                       f"{r.lost} lost, {r.wrong_tokens} wrong")
    if testbed:
        from ..chaos.testbed import run_chaos_testbed

        report = run_chaos_testbed(names, model, policy, requests, gen_tokens, on_result=progress,
                                   log=console.print, transfer=transfer)
    else:
        report = asyncio.run(run_chaos(names, model, policy, requests, gen_tokens, on_result=progress, overrides=overrides))
    out.print(_table(report, f"chaos {where}, policy {policy}", STORE_VICTIM))
    if "reference_equals_single_host" in report:
        same = report["reference_equals_single_host"]
        out.print(f"the testbed's fault-free reference {'equals' if same else 'DIFFERS FROM'} a single-host run's tokens")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1, default=lambda x: None))
        console.print(f"wrote {json_path}")


def _transfer(transfer: str, integrity: bool) -> list[str]:
    """`--transfer` as overrides of the chaos cluster, checked before anything starts (one line each)."""
    overrides = transfer_overrides(transfer)
    if overrides and integrity:
        raise InputError("--transfer mooncake runs the engine and storage faults (not with --corruptions or "
                         "--torn-writes yet)")
    if overrides:
        from ..runtime.transport.mooncake import require_mooncake

        require_mooncake()
    return overrides


def _table(report: dict, title: str, store_victim: int) -> Table:
    table = Table(title=title)
    for col in ("scenario", "requests", "finished", "errored", "lost", "wrong tokens", "recovery s", "victim",
                "persists failed", "store calls skipped"):
        table.add_column(col, justify="right")
    for r in report["results"]:
        rec = "-" if math.isnan(r["recovery_s"]) else f"{r['recovery_s']:.2f}"
        sf = r.get("store_faults") or {}
        victim = ("service" if r["victim"] == store_victim else str(r["victim"])) if r["fired"] else "moment never came"
        table.add_row(r["scenario"], str(r["requests"]), str(r["finished"]), str(r["errored"]), str(r["lost"]),
                      str(r["wrong_tokens"]), rec, victim, str(sf.get("persist_failures", 0)),
                      str(sf.get("router_skipped_calls", 0) + sf.get("engine_skipped_calls", 0)))
    return table


def integrity_acceptance(corruptions: int, torn_writes: int, model: str, probability: float,
                         json_path: Optional[Path]) -> None:
    """`chaos --corruptions N --torn-writes M`: damaged KV bytes (in flight, on disk) against a
    reference (chaos/integrity.py), then writers killed mid-put (chaos/torn_writes.py)."""
    report: dict = {}
    if torn_writes:
        from ..chaos.torn_writes import run_torn_writes

        console.print(f"torn writes: {torn_writes} writers killed with SIGKILL mid-put, the store reopened after each")
        report["torn_writes"] = tw = run_torn_writes(torn_writes)
        out.print(f"torn writes: {tw['kills']} kills ({tw['killed_by_sigkill']} by SIGKILL; stall points {tw['stall_points']}), "
                  f"torn blocks visible after restart: {tw['torn_visible_after_each_restart']} (each), "
                  f"{tw['torn_visible_at_final_restart']} (final)")
    if corruptions:
        from ..chaos.integrity import run_corruptions

        console.print(f"corruptions: rounds on a 1P1D cluster ({model}) until {corruptions} corruptions were injected, "
                      f"{probability} per block piece in flight, one stored block per even conversation per turn")
        rep = asyncio.run(run_corruptions(corruptions, model, probability, on_round=lambda r: console.print(
            f"  {r.side}: {r.flips_in_flight} in flight + {r.flips_on_disk} on disk, {r.wrong_outputs} wrong of {r.requests}")))
        report["corruptions"] = rep
        table = Table(title="transfer and storage integrity")
        cols = ("side", "requests", "wrong_outputs", "flips_in_flight", "flips_on_disk", "layer_checksum_failures",
                "pd_checksum_failures", "layer_retransmits", "kv_recomputes", "quarantined_blocks")
        for col in cols:
            table.add_column(col.replace("_", " "), justify="right")
        for r in rep["rounds"] + [{**rep["total"], "side": "total"}]:
            table.add_row(*(str(r[c]) for c in cols))
        out.print(table)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1))
        console.print(f"wrote {json_path}")
