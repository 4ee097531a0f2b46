"""Engines as Ray actors (`dualpath serve --ray ADDRESS`): each actor runs `dualpath engine` on the
Ray node its bundle lands on and joins the router over the network (engine/join.py), so Ray places
the processes and our own transport (tcp:// control with CURVE, remote writes with lane marks)
carries every byte: Ray does no traffic isolation.

Placement: one bundle per engine, {"CPU": 1} and {"GPU": 1} where the cluster has a GPU per engine,
plus the role's node resource where some node declares it (`ray start --resources
'{"dp_prefill": 1}'` on prefill nodes, "dp_decode" on decode nodes); the placement group is
STRICT_SPREAD when the cluster has a node per engine, else PACK (one machine). Start-up waits
PLACEMENT_TIMEOUT_S for the group and then names what no node could hold.

Restarts: an actor whose process dies (kill -9, a crash, its node lost) is restarted by Ray, at
most ENGINE_MAX_RESTARTS times per engine. The watch thread here sees its `run` fail at once
(RayActorError), tells the router the engine is lost (recovery.py: its requests migrate or wait)
and submits `run` again, which Ray delivers to the restarted actor: it joins asking for its own
place, and the router re-admits it under the next incarnation (router/membership.py). An engine the
router fences for silence (frozen) is killed through Ray (`ray.kill`, restart allowed), so its
successor follows the same way. The cluster waits ENGINE_RESTART_WAIT_S for a successor before
it fails the requests of a role left without engines.

On the testbed (deploy/ray/testbed.py) each Ray node is one emulated host: `addresses` maps
a node's Ray address (its management IP) to where its engine listens (its CNIC address) and its
URL of the storage service (through its own SNIC link), so no engine byte rides Ray's network.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...config import RuntimeConfig
from ...config.overrides import set_fields
from ...errors import InputError

log = logging.getLogger(__name__)

PLACEMENT_TIMEOUT_S = 60.0  # a cluster that has the resources places a group in well under a second
ROLE_RESOURCE = {"prefill": "dp_prefill", "decode": "dp_decode"}
ACTOR_STOP_TIMEOUT_S = 30.0  # an engine ends on the cluster's Stop within its writer's drain
# Restarts per engine actor (Ray's max_restarts): a crash loop (a node that cannot load the model)
# ends after these, with the role's requests failed, instead of restarting for ever. Project choice.
ENGINE_MAX_RESTARTS = 3
# How long a role left without engines waits for a restarted one (RuntimeConfig.faults.restart_wait_s):
# a tiny-model actor's restart, from kill -9 to its Hello, took ~8 s on the 2-core VM with other
# work running (Ray sees the exit at once, then a fresh worker imports Ray, torch and the model);
# 60 s leaves room for a real model's load.
ENGINE_RESTART_WAIT_S = 60.0
# A run submitted to an actor Ray is still restarting fails at once: submit it again after this
# wait, at most MAX_RESUBMITS times in a row (60 s, ENGINE_RESTART_WAIT_S), then count a death
RESUBMIT_WAIT_S = 0.5
MAX_RESUBMITS = 120
WATCH_POLL_S = 0.2  # the watch thread's wait on the runs: a death is seen when Ray reports it


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    """Where an engine on one Ray node talks (the testbed: not the node's Ray address)."""

    listen_host: str  # its control inbox and remote-write target bind here (the CNIC address)
    store_url: str = ""  # its URL of the storage service ("" = the router's)


def _actor_class(ray: Any) -> Any:
    @ray.remote(max_restarts=ENGINE_MAX_RESTARTS, max_task_retries=0)
    class EngineActor:
        """One engine; `run` blocks until the router stops it (then returns its engine id)."""

        def whoami(self) -> dict:
            """This process: its pid, its network namespace (/proc/self/ns/net), its Ray node's address."""
            import os

            return {"pid": os.getpid(), "netns": os.readlink("/proc/self/ns/net"), "node_ip": ray.util.get_node_ip_address()}

        def run(self, router: str, role: str, token_file: str | None, store: str | None, device: str | None,
                threads: int | None, engine: int = -1, addresses: dict | None = None) -> int:
            from ...runtime.engine.join import join, run_joined

            here = (addresses or {}).get(ray.util.get_node_ip_address())
            host = here.listen_host if here else source_address(router)
            welcome = join(router, role, token_file, host, engine=engine)
            run_joined(welcome, host, device, threads, (here.store_url if here else "") or store)
            return welcome.engine

    return EngineActor


def source_address(router: str) -> str:
    """This host's address on the way to `router` (tcp://HOST:PORT): the kernel's choice of source
    for that route, so an engine listens on the network the router is on (not, say, the network
    Ray's node address is on). No packet is sent (a UDP connect only picks the route)."""
    parts = urlsplit(router)
    host = parts.hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, parts.port or 9))
        return s.getsockname()[0]


def restart_config(cfg: RuntimeConfig) -> RuntimeConfig:
    """`cfg` for a cluster whose engines Ray restarts: a role short of engines waits for one."""
    return cfg if cfg.faults.restart_wait_s > 0 else set_fields(cfg, {"faults.restart_wait_s": ENGINE_RESTART_WAIT_S})


def bundles_for(cfg: RuntimeConfig, resources: dict[str, float]) -> list[dict[str, float]]:
    """One bundle per engine, prefill first (pure: `resources` is ray.cluster_resources()). A
    cluster that marks the nodes of one role but none of the other, or has fewer CPUs in all than
    engines, is an InputError at once (a placement that cannot succeed is not waited for)."""
    n = cfg.num_prefill + cfg.num_decode
    marked = [role for role, tag in ROLE_RESOURCE.items() if resources.get(tag, 0) > 0]
    if marked and len(marked) < len(ROLE_RESOURCE):
        role = next(r for r in ROLE_RESOURCE if r not in marked)
        raise InputError(f"the Ray cluster has no node for the {role} role: nodes declare {ROLE_RESOURCE[marked[0]]} "
                         f"but none {ROLE_RESOURCE[role]} (ray start --resources '{{\"{ROLE_RESOURCE[role]}\": 1}}')")
    if resources.get("CPU", 0) < n:
        raise InputError(f"the Ray cluster cannot place {cfg.num_prefill}P{cfg.num_decode}D: it has "
                         f"{resources.get('CPU', 0):g} CPU(s) in all, and each of the {n} engines needs one")
    gpu = {"GPU": 1.0} if resources.get("GPU", 0) >= n else {}
    out = []
    for role, count in (("prefill", cfg.num_prefill), ("decode", cfg.num_decode)):
        tag = ROLE_RESOURCE[role]
        label = {tag: 0.001} if resources.get(tag, 0) > 0 else {}  # a share of the node's role marker
        out += [{"CPU": 1.0, **gpu, **label} for _ in range(count)]
    return out


class RayEngines:
    """The cluster's engines as Ray actors, started before the router waits for them, restarted by
    Ray when their processes die (module docstring)."""

    def __init__(self, ray: Any, cfg: RuntimeConfig, router_endpoint: str, token_file: str | None,
                 store: str | None = None, threads: int | None = None,
                 addresses: dict[str, NodeAddresses] | None = None) -> None:
        self.ray, self.cfg = ray, cfg
        self.router_endpoint, self.token_file, self.store = router_endpoint, token_file, store
        self.threads, self.addresses = threads, addresses
        self.group: Any = None
        self.bundles: list[dict[str, float]] = []
        self.actors: list[Any] = []  # index = engine id (prefill first, as the router numbers them)
        self.runs: list[Any] = []  # each actor's current `run`
        self.restarts: list[int] = []  # restarts Ray made per engine (at most ENGINE_MAX_RESTARTS)
        self._resubmits: list[int] = []  # runs in a row that met the actor restarting, per engine
        self._whoami: list[Any] = []  # each actor's current `whoami` call
        self._cluster: Any = None
        self._loop: Any = None
        self._stopping = threading.Event()
        self._self_reported: set[int] = set()  # deaths this watch told the router of (no kill needed)
        self._watch: threading.Thread | None = None

    def place(self, timeout_s: float = PLACEMENT_TIMEOUT_S) -> None:
        """The placement group, or an InputError naming what no node can hold (nothing left)."""
        from ray.util.placement_group import placement_group

        ray, cfg = self.ray, self.cfg
        self.bundles = bundles = bundles_for(cfg, ray.cluster_resources())
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        strategy = "STRICT_SPREAD" if len(nodes) >= len(bundles) else "PACK"
        self.group = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([self.group.ready()], timeout=timeout_s)
        if not ready:
            self.stop()
            raise InputError(f"the Ray cluster cannot place {cfg.num_prefill}P{cfg.num_decode}D within {timeout_s:.0f} s "
                             f"({strategy} over {len(nodes)} node(s)): no node for {_missing(bundles, nodes)}")

    def start(self, timeout_s: float = PLACEMENT_TIMEOUT_S) -> None:
        """Place (unless placed) and start one actor per engine, each joining `router_endpoint`."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self.group is None:
            self.place(timeout_s)
        cfg, actor = self.cfg, _actor_class(self.ray)
        roles = ["prefill"] * cfg.num_prefill + ["decode"] * cfg.num_decode
        for i, (role, b) in enumerate(zip(roles, self.bundles)):
            a = actor.options(num_cpus=b["CPU"], num_gpus=b.get("GPU", 0), resources={k: v for k, v in b.items()
                              if k not in ("CPU", "GPU")}, scheduling_strategy=PlacementGroupSchedulingStrategy(
                              self.group, placement_group_bundle_index=i)).remote()
            self.actors.append(a)
            self.runs.append(None)
            self._whoami.append(None)
            self.restarts.append(0)
            self._resubmits.append(0)
            self._submit(i)

    def _submit(self, engine: int) -> None:
        """`whoami`, then `run` asking for place `engine` (a sync actor runs them in this order)."""
        role = "prefill" if engine < self.cfg.num_prefill else "decode"
        a = self.actors[engine]
        self._whoami[engine] = a.whoami.remote()
        self.runs[engine] = a.run.remote(self.router_endpoint, role, self.token_file, self.store, None, self.threads,
                                         engine, self.addresses)

    def start_for(self, router_endpoint: str, cluster: Any = None) -> None:
        """`start` once the router has bound (LocalCluster's on_router_ready); with `cluster`, also
        watch the actors: deaths go to its router, its fences kill through Ray (module docstring)."""
        import asyncio

        self.router_endpoint = router_endpoint
        self.start()
        if cluster is not None:
            self._cluster, self._loop = cluster, asyncio.get_running_loop()
            cluster.on_fence = self.kill_engine
            self._watch = threading.Thread(target=self._watch_runs, name="ray-engine-watch", daemon=True)
            self._watch.start()

    def whoami(self, engine: int, timeout_s: float = ENGINE_RESTART_WAIT_S) -> dict:
        """`engine`'s actor process now (after a restart: its successor): pid, netns, node_ip."""
        return self.ray.get(self._whoami[engine], timeout=timeout_s)

    def pid(self, engine: int, timeout_s: float = ENGINE_RESTART_WAIT_S) -> int:
        return self.whoami(engine, timeout_s)["pid"]

    def kill_engine(self, engine: int) -> None:
        """The router fenced `engine`: kill its process through Ray, which restarts the actor (a
        death this watch reported is already over: nothing to kill)."""
        if engine in self._self_reported:
            self._self_reported.discard(engine)
        elif 0 <= engine < len(self.actors) and not self._stopping.is_set():
            self.ray.kill(self.actors[engine], no_restart=False)

    def _watch_runs(self) -> None:
        ray = self.ray
        while not self._stopping.is_set():
            live = {ref: e for e, ref in enumerate(self.runs) if ref is not None}
            if not live:
                return
            done, _ = ray.wait(list(live), num_returns=1, timeout=WATCH_POLL_S)
            for ref in done:
                self._ended(live[ref], ref)

    def _ended(self, engine: int, ref: Any) -> None:
        """`engine`'s run returned (stopped), or its actor died: report it and run its successor."""
        from ray.exceptions import RayActorError

        self.runs[engine] = None
        try:
            self.ray.get(ref)
            return  # the cluster's Stop
        except RayActorError as exc:
            if not self._had_started(engine) and self._resubmits[engine] < MAX_RESUBMITS:
                # the resubmitted run met the actor while Ray restarted it (a transient
                # ActorUnavailableError, as a death is too): no new death, try again
                self._resubmits[engine] += 1
                self._stopping.wait(RESUBMIT_WAIT_S)
                if not self._stopping.is_set():
                    self._submit(engine)
                return
            cause = f"its Ray actor died ({type(exc).__name__})"
            restart = self.restarts[engine] < ENGINE_MAX_RESTARTS
        except Exception as exc:  # the engine itself failed (e.g. refused a place): no restart helps
            cause, restart = f"its Ray actor failed: {str(exc).strip().splitlines()[-1][:200]}", False
        if self._stopping.is_set():
            return
        log.warning("engine %d: %s%s", engine, cause, "; Ray restarts it" if restart else "")
        if self._cluster.router is not None and self._cluster.router.liveness.is_alive(engine):
            self._self_reported.add(engine)
        self._loop.call_soon_threadsafe(self._cluster.router.membership.engine_lost, engine, cause)
        if restart:
            self.restarts[engine] += 1
            self._submit(engine)

    def _had_started(self, engine: int) -> bool:
        """Whether the failed run's actor was alive to start it: its `whoami`, sent just before,
        answered. A death while running is a restart to count; a call that met the actor dead
        or restarting is not."""
        try:
            self.ray.get(self._whoami[engine], timeout=0.0)
        except Exception:
            return False
        self._resubmits[engine] = 0
        return True

    def stop(self) -> None:
        """After the cluster's Stop: collect the runs, then end the actors and free the group."""
        ray = self.ray
        self._stopping.set()
        if self._watch is not None:
            self._watch.join(timeout=5)
        runs = [r for r in self.runs if r is not None]
        if runs:
            ray.wait(runs, num_returns=len(runs), timeout=ACTOR_STOP_TIMEOUT_S)
        for a in self.actors:
            ray.kill(a, no_restart=True)
        if self.group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self.group)
        self.actors, self.runs, self.group = [], [], None


def _missing(bundles: list[dict[str, float]], nodes: list[dict]) -> str:
    """The first bundle no single live node could hold, in words."""
    for b in bundles:
        if not any(all(n.get("Resources", {}).get(k, 0) >= v for k, v in b.items()) for n in nodes):
            role = next((r for r, tag in ROLE_RESOURCE.items() if tag in b), "an engine")
            return f"{role} ({', '.join(f'{k}={v:g}' for k, v in b.items())})"
    return "one engine per node (STRICT_SPREAD needs a node per engine)"
