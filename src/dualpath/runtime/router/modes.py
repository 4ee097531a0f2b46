"""Switching a live, idle cluster to another mode on a fresh store (`dualpath demo` runs basic then
dualpath on the same engines): every engine drains its reads and writes, reopens its store and
acknowledges; then the router's config, store, metrics and scheduler follow."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from ..protocol import Reconfigure
from .metrics import RouterMetrics


async def switch_mode(router: Any, mode: str, store: Any, store_root: str, timeout_s: float) -> None:
    if router.requests:
        raise RuntimeError("reconfigure needs an idle cluster")
    router.reconfigured = set()
    for e in router.live_engines():
        e.outbox.send(Reconfigure(mode, store_root))
    deadline = router.clock.now_s() + timeout_s
    while len(router.reconfigured) < len(router.live_engines()):
        if router.clock.now_s() > deadline:
            raise RuntimeError("engines did not acknowledge the new mode")
        await asyncio.sleep(0.02)
    router.cfg = replace(router.cfg, mode=mode)
    router.features = router.cfg.features
    router.placement.store = store
    router.metrics = RouterMetrics(router.clock, lambda: router.store)
    router.new_scheduler()

