"""`dualpath serve`: the OpenAI-compatible server in front of a local cluster.

The cluster must start on the server's event loop (the router lives there), so the app gets a
lifespan that starts it, and a proxy that forwards to the router once it is up.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

from ...config import RuntimeConfig
from ..cluster import LocalCluster
from ..server.admission import ServerLimits


class ClusterRouter:
    """A `Router` that is the cluster's router once started; until then /health says starting."""

    def __init__(self, cluster: LocalCluster, model_name: str) -> None:
        self._cluster = cluster
        self.model_name = model_name

    def __getattr__(self, name: str) -> Any:
        router = self._cluster.router
        if router is None:
            raise AttributeError(f"the cluster is still starting ({name})")
        return getattr(router, name)

    def health(self) -> dict:
        router = self._cluster.router
        if router is None or len(router.engines) < router._expected_engines:
            return {"status": "starting"}
        return {"status": "ok", **router.health()}


def make_app(cfg: RuntimeConfig, api_key: str | None = None, limits: ServerLimits | None = None,
             engines_listen: str | None = None, ray_engines: Any = None):
    """The app and its cluster; `ray_engines` (a placed RayEngines): its actors start once the
    router has bound, are watched, and are stopped with the cluster."""
    from ..server.app import create_app

    cluster = LocalCluster(cfg, engines_listen=engines_listen)
    proxy = ClusterRouter(cluster, cfg.model)
    if ray_engines is not None:  # engines as Ray actors that join the router (ray_engines.py)
        cluster.on_router_ready = lambda endpoint: ray_engines.start_for(endpoint, cluster)  # bound: no port race

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await cluster.start()
        try:
            yield
        finally:
            await cluster.stop()

    return create_app(proxy, api_key, limits=limits or ServerLimits(), lifespan=lifespan), cluster


def serve_cluster(cfg: RuntimeConfig, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                  limits: ServerLimits | None = None, engines_listen: str | None = None,
                  ray_address: str | None = None) -> None:
    """Serve until stopped. With `ray_address`, Ray is joined and the engines' placement group
    placed first, so an unreachable address, a role no node holds or a cluster too small is one
    InputError before the server starts (and nothing is left running: ray_pool.ray_session)."""
    import uvicorn

    with contextlib.ExitStack() as stack:
        engines = None
        if ray_address is not None:
            from ...pool.ray_pool import ray_session
            from .ray_engines import RayEngines, restart_config

            ray = stack.enter_context(ray_session(ray_address)).ray
            cfg = restart_config(cfg)
            engines = RayEngines(ray, cfg, "", cfg.peer_token_file, cfg.store_dir)
            engines.place()
            stack.callback(engines.stop)
        app, _ = make_app(cfg, api_key, limits, engines_listen, engines)
        uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
