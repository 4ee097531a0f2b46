"""The router's side of a testbed run: started in the router host's namespace by deploy/testbed/demo.py.

`python -m dualpath.deploy.testbed.driver SPEC.json OUT.json`: a cluster whose engines join over the
compute network (`engines_listen`), KV and control over TCP (`transport.kind` tcp), the store
the storage service reached through the router host's SNIC link, no emulated rate anywhere (the
kernel's qdiscs enforce them); the demo's workload in one mode; the result as JSON. With
`spec["ray"]` the engines are Ray actors on the hosts' Ray nodes (deploy/ray/driver.py).
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import replace

from ...config import RuntimeConfig
from ...config.runtime import KvTransfer
from ...config.overrides import set_fields
from ...runtime.cluster import LocalCluster
from ...runtime.apps.demo import demo_config, demo_workload, run_workload


def _across_hosts(cfg: RuntimeConfig, spec: dict) -> RuntimeConfig:
    """Engines on the testbed's hosts: tcp with the shared token, the storage service at its URL, KV
    by the spec's transfer (our remote writes unless it says mooncake)."""
    return set_fields(cfg, {"transport.kind": "tcp", "transport.peer_token_file": spec["token_file"],
                            "store.location": spec["store_url"],
                            "transport.transfer": KvTransfer(spec.get("transfer", KvTransfer.REMOTE_WRITE))})


async def drive(spec: dict) -> dict:
    cfg = _across_hosts(replace(demo_config(spec["mode"], None, spec["model"]), seed=spec["seed"], device=spec["device"]),
                        spec)
    workload = demo_workload(spec["agents"], spec["rounds"])
    if spec.get("ray"):  # engines as Ray actors on the hosts' Ray nodes (deploy/ray/driver.py)
        from ..ray.driver import drive_on_ray

        result, router = await drive_on_ray(spec, cfg, workload)
    else:
        async with LocalCluster(cfg, start_timeout_s=spec.get("start_timeout_s", 300.0), engines_listen=spec["listen"]) as c:
            result = await run_workload(c, workload)
        router = c.router
    result["ledger"] = _ledger(router)
    return result


async def drive_trace(spec: dict) -> dict:
    """`run --testbed`: the trace of spec["trace"] replayed in one mode (run.py's replay_on)."""
    from pathlib import Path

    from ...runtime.apps.run import replay_on, trace_config

    t = spec["trace"]
    cfg = _across_hosts(trace_config(spec["model"], spec["pd"], spec["mode"], t["max_len"], None, spec["device"]), spec)
    async with LocalCluster(cfg, start_timeout_s=spec.get("start_timeout_s", 300.0), engines_listen=spec["listen"]) as c:
        result = await replay_on(c, Path(t["path"]), spec["mode"], t["limit"], t["max_len"], t["time_scale"])
    return {**result, "ledger": _ledger(c.router)}


def _ledger(router) -> dict:
    counters = router.metrics.engine_counters  # the engines' last report, sent as they stopped
    return {str(e): {"storage_read_bytes": x.storage_read_bytes, "storage_write_bytes": x.storage_write_bytes,
                     "remote_write_bytes": x.remote_write_bytes, "control_bytes": x.control_bytes,
                     "cnic_lc_bytes": x.cnic_lc_bytes}  # its LC lane's bytes: with tp=2, + the collectives' tensors
            for e, x in sorted(counters.items())}


def main(argv: list[str]) -> int:
    spec_path, out_path = argv
    with open(spec_path) as f:
        spec = json.load(f)
    result = asyncio.run(drive_trace(spec) if "trace" in spec else drive(spec))
    with open(out_path, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
