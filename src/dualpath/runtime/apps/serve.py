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
             engines_listen: str | None = None, ray_address: str | None = None):
    from ..server.app import create_app

    cluster = LocalCluster(cfg, engines_listen=engines_listen)
    proxy = ClusterRouter(cluster, cfg.model)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        with contextlib.ExitStack() as stack:
            if ray_address is not None:  # engines as Ray actors that join the router (ray_engines.py)
                from ...pool.ray_pool import ray_session
                from .ray_engines import RayEngines

                ray = stack.enter_context(ray_session(ray_address)).ray
                engines = RayEngines(ray, cfg, "", cfg.peer_token_file, cfg.store_dir)
                stack.callback(engines.stop)
                cluster.on_router_ready = engines.start_for  # once the router is bound: no port race
            await cluster.start()
            try:
                yield
            finally:
                await cluster.stop()

    return create_app(proxy, api_key, limits=limits or ServerLimits(), lifespan=lifespan), cluster


def serve_cluster(cfg: RuntimeConfig, host: str = "127.0.0.1", port: int = 8000, api_key: str | None = None,
                  limits: ServerLimits | None = None, engines_listen: str | None = None,
                  ray_address: str | None = None) -> None:
    import uvicorn

    app, _ = make_app(cfg, api_key, limits, engines_listen, ray_address)
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
