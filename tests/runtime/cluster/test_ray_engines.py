"""Engines as Ray actors (deploy/ray/engines.py): on a local Ray of 3 CPUs, a placement group
puts one actor per engine, each runs `dualpath engine` and joins the router over TCP; the
conversation gives the recompute's tokens. The bundles follow the cluster's resources (pure), and
a role no node can hold is named within the placement timeout."""

from __future__ import annotations

import asyncio

import pytest

from dualpath.config import EngineConfig, RuntimeConfig, TransportConfig
from dualpath.errors import InputError
from dualpath.deploy.ray.engines import RayEngines, bundles_for
from test_kv_paths import DEVICE, cluster_conversation, reference_conversation


def test_bundles_follow_the_cluster_resources():
    cfg = RuntimeConfig(model="tiny", num_prefill=1, num_decode=2)
    assert bundles_for(cfg, {"CPU": 8}) == [{"CPU": 1.0}] * 3
    assert bundles_for(cfg, {"CPU": 8, "GPU": 3})[0] == {"CPU": 1.0, "GPU": 1.0}
    assert bundles_for(cfg, {"CPU": 8, "GPU": 2})[0] == {"CPU": 1.0}  # not one GPU per engine: CPUs
    tagged = bundles_for(cfg, {"CPU": 8, "dp_prefill": 1, "dp_decode": 2})
    assert tagged[0] == {"CPU": 1.0, "dp_prefill": 0.001} and tagged[1] == {"CPU": 1.0, "dp_decode": 0.001}


@pytest.mark.slow
def test_engines_as_ray_actors_join_and_give_the_recompute_tokens():
    ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
    listen = "tcp://127.0.0.1:0"  # the router binds a free port; the actors start once it has
    cfg = RuntimeConfig(model="tiny", mode="dualpath", force_read_side="decode",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        transport=TransportConfig(kind="tcp"), device=DEVICE)
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        too_big = RayEngines(ray, RuntimeConfig(model="tiny", num_prefill=4, num_decode=4), "tcp://127.0.0.1:9", None)
        with pytest.raises(InputError, match="cannot place 4P4D"):
            too_big.start(timeout_s=3)
        too_big.stop()
        engines = RayEngines(ray, cfg, "", None)
        try:
            outs, _, summary = asyncio.run(cluster_conversation(cfg, engines_listen=listen, on_router_ready=engines.start_for))
        finally:
            engines.stop()
        assert outs == reference_conversation("tiny")
        assert summary["bytes"]["remote_writes"] > 0
    finally:
        ray.shutdown()
