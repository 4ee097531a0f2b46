"""`dualpath run TRACE --testbed`: replay a trajectory file or a Mooncake trace across emulated hosts.

As `demo --testbed` (deploy/testbed/demo.py) with the trace in place of the demo's workload:

1. A reference first: the same trace on a local cluster of the same shape at real speed; its tokens'
   digest is what every testbed run must give.
2. `testbed up` for the P/D shape with a router host; every node's SNIC link at `--snic-mb-s`, its
   CNIC at CNIC_PER_SNIC x that (docs/paper.md §1.2), HTB with the two lanes. No token bucket in any
   process.
3. Per mode, on a fresh store: the storage service in the storage host, the driver (router + the
   replay, deploy/testbed/driver.py) in the router host, one `dualpath engine` per node host.
4. Each link's kernel byte counters before and after, beside the runtime's ledger.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable

from ...config import CNIC_PER_SNIC
from ...parsing import parse_pd
from . import netns
from .plan import plan_testbed
from .demo import run_mode, work_dir


def single_host_trace_digest(trace: Path, model: str, pd: str, limit: int, max_len: int, time_scale: float,
                             device: str) -> str:
    """The tokens digest of the trace on a local cluster at real speed (dualpath mode: the tokens
    do not depend on the mode, which tests/runtime check)."""
    from ...runtime.apps.run import run_trace

    result = asyncio.run(run_trace(trace, model, pd, ["dualpath"], limit, max_len, time_scale, None, device))
    return result["runs"][0]["tokens_sha256"]


def full_block_bytes(model: str, device: str) -> int:
    """A Full Block's KV bytes (the header `ledger_vs_kernel` states per block read)."""
    from ...config import RuntimeConfig
    from ...runtime.engine.base import kv_dtype
    from ...runtime.model import load_model

    cfg = RuntimeConfig(model=model, device=device)
    mcfg = load_model(model, device="cpu").model.config
    return mcfg.kv_bytes_per_token_per_layer(kv_dtype(cfg)) * mcfg.num_layers * cfg.block_tokens


def run_testbed_trace(trace: Path, model: str, pd: str, modes: list[str], limit: int, max_len: int, time_scale: float,
                      snic_mb_s: float, device: str = "cpu", run_id: str = "run",
                      log: Callable[[str], None] = print, transfer: str = "remote-write") -> dict[str, Any]:
    """`transfer`: who moves KV between the hosts (deploy/testbed/demo.py `run_testbed_demo`)."""
    from ...runtime.engine.cpus import available_cpus, plan_cpus

    netns.check_can_run()
    p, d = parse_pd(pd)
    snic = snic_mb_s * 1e6
    cpu_plan = plan_cpus(range(p + d), available_cpus(), None)
    log(f"reference: {trace.name} on one host at real speed ({pd})")
    reference = single_host_trace_digest(trace, model, pd, limit, max_len, time_scale, device)
    plan = plan_testbed(run_id, p, d, snic, CNIC_PER_SNIC * snic, router=True)
    netns.up(plan)
    try:
        with work_dir() as (work, token):
            spec = {"model": model, "device": device, "token_file": str(token), "pd": pd, "transfer": transfer,
                    "trace": {"path": str(trace.resolve()), "limit": limit, "max_len": max_len, "time_scale": time_scale}}
            runs = []
            for mode in modes:
                log(f"{mode}: {trace.name} across the testbed's hosts (SNIC {snic / 1e6:.1f} MB/s, "
                    f"CNIC {CNIC_PER_SNIC * snic / 1e6:.1f} MB/s, enforced by tc)")
                runs.append(run_mode(plan, mode, spec, work, cpu_plan.cpus_by_engine, cpu_plan.threads_by_engine))
    finally:
        netns.down(plan.run_id)
    return {"config": {"model": model, "pd": pd, "transfer": transfer, "trace": str(trace), "limit": limit, "max_len": max_len,
                       "time_scale": time_scale, "device": device, "snic_bytes_per_s": snic,
                       "cnic_bytes_per_s": CNIC_PER_SNIC * snic, "full_block_bytes": full_block_bytes(model, device),
                       "testbed": netns.plan_json(plan)},
            "reference_tokens_sha256": reference, "runs": runs}
