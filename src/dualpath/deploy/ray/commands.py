"""`serve --ray` and `run --ray`: the local-cluster commands (runtime/apps/) with the engines as Ray
actors (engines.py). The command joins Ray for its whole life (pool.py: ray_session: an
unreachable address, a role no node holds or a cluster too small is one InputError before anything
starts, and nothing is left running); each cluster places its engines first, starts them once the
router has bound a port (no port race), and stops them with the cluster."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Iterator

from ...config import RuntimeConfig
from ...config.overrides import set_fields
from ...runtime.apps.run import ClusterFactory
from ...runtime.apps.serve import serve_cluster
from ...runtime.cluster import LocalCluster
from .engines import RayEngines, restart_config
from .pool import ray_session


def _router_host(ray: Any, address: str) -> str:
    """Where the actors reach the router: loopback on a local Ray, else this node's address."""
    return "127.0.0.1" if address == "local" else ray.util.get_node_ip_address()


@contextlib.contextmanager
def ray_clusters(address: str) -> Iterator[ClusterFactory]:
    """For `run --ray`: a Ray session for the command, and the cluster factory `run_trace` calls per
    mode (a fresh set of actors each)."""
    with ray_session(address) as session:
        ray = session.ray
        host = _router_host(ray, address)

        @contextlib.asynccontextmanager
        async def cluster_on_ray(cfg: RuntimeConfig) -> AsyncIterator[LocalCluster]:
            cfg = restart_config(set_fields(cfg, {"transport.kind": "tcp"}))
            engines = RayEngines(ray, cfg, "", cfg.transport.peer_token_file, cfg.store.location)
            engines.place()
            try:
                cluster = LocalCluster(cfg, engines_listen=f"tcp://{host}:0",
                                       on_router_ready=lambda endpoint: engines.start_for(endpoint, cluster))
                async with cluster:
                    yield cluster
            finally:
                engines.stop()

        yield cluster_on_ray


def serve_on_ray(address: str, cfg: RuntimeConfig, **server: Any) -> None:
    """`serve --ray`: the engines' placement group placed before the server starts; `server`: the
    arguments of runtime/apps/serve.py: serve_cluster."""
    with ray_session(address) as session:
        cfg = restart_config(cfg)
        engines = RayEngines(session.ray, cfg, "", cfg.transport.peer_token_file, cfg.store.location)
        engines.place()
        try:
            serve_cluster(cfg, joining_engines=engines, **server)
        finally:
            engines.stop()
