"""`dualpath serve`: the OpenAI-compatible server in front of a local cluster.

The cluster must start on the server's event loop (the router lives there), so the app gets a
lifespan that starts it, and a proxy that forwards to the router once it is up.
"""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator, Mapping

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
        if router is None or len(router.engines) < router.membership.expected_engines:
            return {"status": "starting"}
        return {"status": "ok", **router.health()}


def make_app(cfg: RuntimeConfig, api_key: str | Mapping[str, str] | None = None, limits: ServerLimits | None = None,
             engines_listen: str | None = None, joining_engines: Any = None):
    """The app and its cluster; `joining_engines` (engines started elsewhere that join the router,
    placed already: deploy/ray/engines.py: RayEngines): its `start_for(endpoint, cluster)` is called
    once the router has bound."""
    from ..server.app import create_app

    cluster = LocalCluster(cfg, engines_listen=engines_listen)
    proxy = ClusterRouter(cluster, cfg.model)
    if joining_engines is not None:
        cluster.on_router_ready = lambda endpoint: joining_engines.start_for(endpoint, cluster)  # bound: no port race

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        await cluster.start()
        try:
            yield
        finally:
            await cluster.stop()

    return create_app(proxy, api_key, limits=limits or ServerLimits(), lifespan=lifespan), cluster


def serve_cluster(cfg: RuntimeConfig, host: str = "127.0.0.1", port: int = 8000, api_key: str | Mapping[str, str] | None = None,
                  limits: ServerLimits | None = None, engines_listen: str | None = None,
                  joining_engines: Any = None) -> None:
    """Serve until stopped (`joining_engines`: make_app; deploy/ray/commands.py: serve_on_ray)."""
    import uvicorn

    app, _ = make_app(cfg, api_key, limits, engines_listen, joining_engines)
    uvicorn.run(app, host=host, port=port, log_level="info", timeout_graceful_shutdown=5)
