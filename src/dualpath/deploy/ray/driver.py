"""The router's side of a testbed run on Ray (deploy/testbed/driver.py with `spec["ray"]`; deploy/ray/testbed.py
has the nodes): join the head, wait for every node, and place the engines as Ray actors, one per
node host by its role resource; each listens on its host's CNIC address and reads through its own
SNIC link (deploy/ray/engines.py: NodeAddresses). Then either the demo's workload, or the restart check.

The restart check (`spec["ray"]["restart_check"]`), on one cluster:
  1. turn A, then turn B (A's context plus more): B's tokens are the baseline;
  2. B again, and at its first token kill -9 of the decode actor's process: Ray restarts the
     actor, the router re-admits it (router/membership.py), the request migrates and completes;
  3. B once more, served by the successor.
Reported: the pids and network namespaces before and after, the seconds from the kill to step 2's
last token and to step 3's, and whether both streams equal the baseline (greedy: they must).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from ...runtime.api import GenerationRequest, SamplingParams
from ...runtime.cluster import LocalCluster
from ...runtime.apps.demo import run_workload
from ...runtime.router.router import Router

RESTART_GEN_TOKENS = 32  # per request of the restart check: a few seconds of decode on the demo's model


async def _generate(router: Router, name: str, prompt: list[int], on_first: Any = None) -> list[int] | str:
    """Greedy tokens of one request, or the error it ended with (ServiceUnavailable's text)."""
    params = SamplingParams(max_tokens=RESTART_GEN_TOKENS, temperature=0, ignore_eos=True)
    out: list[int] = []
    try:
        async for ev in router.generate(GenerationRequest(name, tuple(prompt), params)):
            out.append(ev.token_id)
            if on_first is not None and len(out) == 1:
                on_first()
    except Exception as exc:  # the router's one error for a request it could not finish
        return f"{type(exc).__name__}: {exc}"
    return out


async def restart_check(cluster: LocalCluster, engines: Any) -> dict:
    """Steps 1-3 of the module docstring."""
    router, decode = cluster.router, cluster.cfg.num_prefill  # the first decode engine
    vocab = router.tokenizer.vocab_size
    a = [(100 + 7 * i) % vocab for i in range(512)]
    out_a = await _generate(router, "restart-a", a)
    b = a + list(out_a) + [(900 + 3 * i) % vocab for i in range(64)]
    baseline = await _generate(router, "restart-b", b)
    before = engines.whoami(decode)
    killed: dict[str, float] = {}

    def kill() -> None:
        os.kill(before["pid"], signal.SIGKILL)
        killed["at_s"] = time.monotonic()

    in_flight = await _generate(router, "restart-b-in-flight", b, kill)
    in_flight_s = time.monotonic() - killed["at_s"]
    following = await _generate(router, "restart-b-next", b)
    return {"decode_engine": decode, "before": before, "after": engines.whoami(decode), "in_flight_s": in_flight_s,
            "next_done_s": time.monotonic() - killed["at_s"], "baseline_tokens": baseline, "in_flight_tokens": in_flight,
            "next_tokens": following, "in_flight_same": in_flight == baseline, "next_same": following == baseline,
            "restarts": {str(e): n for e, n in router.liveness.restarts.items()}, "health": router.health()}


async def drive_on_ray(spec: dict, cfg: Any, workload: Any) -> tuple[dict, Any]:
    """(the run's result, its router): the workload, or the restart check, on engines as Ray actors."""
    from .pool import ray_session
    from .engines import NodeAddresses, RayEngines, restart_config
    from .testbed import wait_for_nodes

    r = spec["ray"]
    os.environ.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=r["auth_token"])  # this run's cluster (deploy/ray/testbed.py)
    with ray_session(r["address"]) as ex:
        wait_for_nodes(ex.ray, r["nodes"])
        cfg = restart_config(cfg)
        addresses = {ip: NodeAddresses(host, url) for ip, (host, url) in r["addresses"].items()}
        engines = RayEngines(ex.ray, cfg, "", cfg.transport.peer_token_file, None, threads=r.get("threads"), addresses=addresses)
        engines.place()
        try:
            cluster = LocalCluster(cfg, start_timeout_s=spec.get("start_timeout_s", 300.0), engines_listen=spec["listen"],
                                   on_router_ready=lambda endpoint: engines.start_for(endpoint, cluster))
            async with cluster as c:
                placed = [engines.whoami(e) for e in range(cfg.num_prefill + cfg.num_decode)]
                if r.get("restart_check"):
                    result = {"mode": cfg.mode, "restart": await restart_check(c, engines)}
                else:
                    result = await run_workload(c, workload)
                result["ray_engines"] = placed
        finally:
            engines.stop()
    return result, c.router
