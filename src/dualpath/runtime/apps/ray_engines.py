"""Engines as Ray actors (`dualpath serve --ray ADDRESS`): each actor runs `dualpath engine` on the
Ray node its bundle lands on and joins the router over the network (engine/join.py), so Ray places
the processes and our own transport (tcp:// control with CURVE, remote writes with lane marks)
carries every byte: Ray does no traffic isolation.

Placement: one bundle per engine, {"CPU": 1} and {"GPU": 1} where the cluster has a GPU per engine,
plus the role's node resource where some node declares it (`ray start --resources
'{"dp_prefill": 1}'` on prefill nodes, "dp_decode" on decode nodes); the placement group is
STRICT_SPREAD when the cluster has a node per engine, else PACK (one machine). Start-up waits
PLACEMENT_TIMEOUT_S for the group and then names what no node could hold.
"""

from __future__ import annotations

from typing import Any

from ...config import RuntimeConfig
from ...errors import InputError

PLACEMENT_TIMEOUT_S = 60.0  # a cluster that has the resources places a group in well under a second
ROLE_RESOURCE = {"prefill": "dp_prefill", "decode": "dp_decode"}
ACTOR_STOP_TIMEOUT_S = 30.0  # an engine ends on the cluster's Stop within its writer's drain


def _actor_class(ray: Any) -> Any:
    @ray.remote(max_restarts=0)
    class EngineActor:
        """One engine; `run` blocks until the router stops it (then returns its engine id)."""

        def run(self, router: str, role: str, token_file: str | None, store: str | None,
                device: str | None, threads: int | None) -> int:
            from ..engine.join import join, run_joined

            host = "127.0.0.1" if router.startswith("tcp://127.") else ray.util.get_node_ip_address()
            welcome = join(router, role, token_file, host)
            run_joined(welcome, host, device, threads, store)
            return welcome.engine

    return EngineActor


def bundles_for(cfg: RuntimeConfig, resources: dict[str, float]) -> list[dict[str, float]]:
    """One bundle per engine, prefill first (pure: `resources` is ray.cluster_resources())."""
    n = cfg.num_prefill + cfg.num_decode
    gpu = {"GPU": 1.0} if resources.get("GPU", 0) >= n else {}
    out = []
    for role, count in (("prefill", cfg.num_prefill), ("decode", cfg.num_decode)):
        tag = ROLE_RESOURCE[role]
        label = {tag: 0.001} if resources.get(tag, 0) > 0 else {}  # a share of the node's role marker
        out += [{"CPU": 1.0, **gpu, **label} for _ in range(count)]
    return out


class RayEngines:
    """The cluster's engines as Ray actors, started before the router waits for them."""

    def __init__(self, ray: Any, cfg: RuntimeConfig, router_endpoint: str, token_file: str | None,
                 store: str | None = None) -> None:
        self.ray, self.cfg = ray, cfg
        self.router_endpoint, self.token_file, self.store = router_endpoint, token_file, store
        self.group: Any = None
        self.actors: list[Any] = []
        self.runs: list[Any] = []

    def start(self, timeout_s: float = PLACEMENT_TIMEOUT_S) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        ray, cfg = self.ray, self.cfg
        bundles = bundles_for(cfg, ray.cluster_resources())
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        strategy = "STRICT_SPREAD" if len(nodes) >= len(bundles) else "PACK"
        self.group = placement_group(bundles, strategy=strategy)
        ready, _ = ray.wait([self.group.ready()], timeout=timeout_s)
        if not ready:
            raise InputError(f"the Ray cluster cannot place {cfg.num_prefill}P{cfg.num_decode}D within {timeout_s:.0f} s "
                             f"({strategy} over {len(nodes)} node(s)): no node for {_missing(bundles, nodes)}")
        actor = _actor_class(ray)
        roles = ["prefill"] * cfg.num_prefill + ["decode"] * cfg.num_decode
        for i, (role, b) in enumerate(zip(roles, bundles)):
            a = actor.options(num_cpus=b["CPU"], num_gpus=b.get("GPU", 0), resources={k: v for k, v in b.items()
                              if k not in ("CPU", "GPU")}, scheduling_strategy=PlacementGroupSchedulingStrategy(
                              self.group, placement_group_bundle_index=i)).remote()
            self.actors.append(a)
            self.runs.append(a.run.remote(self.router_endpoint, role, self.token_file, self.store, None, None))

    def start_for(self, router_endpoint: str) -> None:
        """`start` once the router has bound (LocalCluster's on_router_ready)."""
        self.router_endpoint = router_endpoint
        self.start()

    def stop(self) -> None:
        """After the cluster's Stop: collect the runs, then end the actors and free the group."""
        ray = self.ray
        if self.runs:
            ray.wait(self.runs, num_returns=len(self.runs), timeout=ACTOR_STOP_TIMEOUT_S)
        for a in self.actors:
            ray.kill(a)
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
