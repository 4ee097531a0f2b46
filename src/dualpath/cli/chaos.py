"""`dualpath chaos`: engine faults on a local cluster against a fault-free reference
(runtime/apps/chaos.py)."""

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


def chaos(
    scenario: Annotated[Optional[list[str]], typer.Option(
        help="ROLE-SIGNAL-MOMENT, e.g. de-kill-decode (pe|de x kill|term|stop x read|prefill (pe)|decode (de)), or all; repeat")] = None,
    model: Annotated[str, typer.Option(help="tiny (seconds per scenario) or smollm2-135m")] = "tiny",
    policy: Annotated[str, typer.Option(help="recompute (migrate to a survivor) | fail (an error to the client)")] = "recompute",
    requests: Annotated[int, typer.Option(help="greedy requests per turn")] = 4,
    gen_tokens: Annotated[int, typer.Option(help="tokens each request generates")] = 48,
    json_path: Annotated[Optional[Path], typer.Option("--json", help="write the table as JSON here")] = None,
) -> None:
    """Kill, terminate or freeze an engine of a 2P2D cluster while it reads, prefills or decodes;
    print per scenario how many requests finished (with the reference's tokens), errored or were lost."""
    from ..runtime.apps.chaos import parse_scenarios, run_chaos

    names = parse_scenarios(scenario)
    if policy not in ("recompute", "fail"):
        raise InputError(f"--policy must be recompute or fail, got {policy!r}")
    if requests <= 0 or gen_tokens <= 0:
        raise InputError("--requests and --gen-tokens must be positive")
    console.print(f"chaos: {len(names)} scenario(s) on a 2P2D cluster ({model}, policy {policy}), "
                  f"each against a fault-free reference run")
    report = asyncio.run(run_chaos(names, model, policy, requests, gen_tokens,
                                   on_result=lambda r: console.print(f"  {r.scenario}: {r.finished}/{r.requests} finished, "
                                                                     f"{r.errored} errored, {r.lost} lost, {r.wrong_tokens} wrong")))
    table = Table(title=f"chaos, policy {policy}")
    for col in ("scenario", "requests", "finished", "errored", "lost", "wrong tokens", "recovery s", "victim"):
        table.add_column(col, justify="right")
    for r in report["results"]:
        rec = "-" if math.isnan(r["recovery_s"]) else f"{r['recovery_s']:.2f}"
        table.add_row(r["scenario"], str(r["requests"]), str(r["finished"]), str(r["errored"]), str(r["lost"]),
                      str(r["wrong_tokens"]), rec, str(r["victim"]) if r["fired"] else "moment never came")
    out.print(table)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=1, default=lambda x: None))
        console.print(f"wrote {json_path}")
