"""Engine restarts through Ray (deploy/ray/engines.py, router/membership.py): kill -9 of the
decode actor's process mid-conversation. Ray restarts the actor, it joins asking for its own
place, the router re-admits it under incarnation 1; the request in flight at the kill waits for
it (engine_restart_wait_s) and completes, migrated, with the recompute's tokens, within the bound;
the next turn is served by the successor with the recompute's tokens, its KV crossing by remote
writes into the PE, which fenced the dead incarnation and accepts the new one. Then the successor
freezes (SIGSTOP): the router fences it for silence, kills it through Ray (`ray.kill`, restart
allowed), and the third incarnation serves the last turn."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from dualpath.config import EngineConfig, FaultConfig, RuntimeConfig, TransportConfig
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.cluster import LocalCluster
from dualpath.runtime.model import load_model
from persist_wait import wait_chain_stored
from test_kv_paths import DEVICE

TURNS = [list(range(5, 205)), list(range(20, 60)), list(range(100, 170)), list(range(30, 90))]
GEN = 40  # long enough that the kill after the first token lands while the DE still decodes
DECODE = 1  # 1P1D: the decode engine's id
HEARTBEAT_TIMEOUT_S = 2.0  # short, so the frozen step is quick; 10x the 0.4 s beat interval


def reference(turns: list[list[int]]) -> list[list[int]]:
    """Greedy tokens by full recompute, turn by turn (eos ignored, as the requests do)."""
    m = load_model("tiny").model
    context: list[int] = []
    outs = []
    for append in turns:
        ids, out = context + append, []
        for _ in range(GEN):
            out.append(int(m.forward(ids)[-1].argmax()))
            ids = ids + [out[-1]]
        outs.append(out)
        context = ids
    return outs


async def conversation(cfg: RuntimeConfig, engines) -> dict:
    cluster = LocalCluster(cfg, start_timeout_s=180, engines_listen="tcp://127.0.0.1:0",
                           on_router_ready=lambda endpoint: engines.start_for(endpoint, cluster))
    async with cluster as c:
        context: list[int] = []
        outs, seen = [], {}
        for i, append in enumerate(TURNS):
            prompt, out = tuple(context + append), []
            if i == 3:  # frozen, not dead: only the heartbeat timeout sees it
                seen["frozen_pid"] = engines.pid(DECODE)
                os.kill(seen["frozen_pid"], signal.SIGSTOP)
            params = SamplingParams(max_tokens=GEN, temperature=0, ignore_eos=True)
            async for ev in c.router.generate(GenerationRequest(f"t{i}", prompt, params)):
                out.append(ev.token_id)
                if i == 1 and len(out) == 1:  # mid-request: kill -9 the decode actor's process
                    seen["pid_before"] = engines.pid(DECODE)
                    os.kill(seen["pid_before"], signal.SIGKILL)
                    seen["killed_at_s"] = time.monotonic()
            if i == 1:
                seen["in_flight_s"] = time.monotonic() - seen["killed_at_s"]
                seen["remote_writes_before_turn_3"] = c.router.metrics.summary()["bytes"]["remote_writes"]
            outs.append(out)
            context = list(prompt) + out
            await wait_chain_stored(c.router.store, context[:-1], cfg.block_tokens)
        c.router.check_invariants()
        seen.update(outs=outs, restarts=dict(c.router.liveness.restarts), incarnation=dict(c.router.liveness.incarnation),
                    pid_after=engines.pid(DECODE), health=c.router.health(), migrated=c.router.metrics.summary())
    seen["remote_writes_after"] = c.router.metrics.summary()["bytes"]["remote_writes"]
    return seen


def test_a_killed_decode_actor_is_restarted_and_its_place_given_back():
    """In the default run (CI installs the `cluster` extra): 25-30 s quiet, 106 s beside three CPU
    hogs. Restarts are counted by deaths of a started run (RayEngines._had_started), not by every
    failed call: under load a resubmitted run meets the restarting actor and fails at once."""
    ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
    from dualpath.deploy.ray.engines import ENGINE_RESTART_WAIT_S, RayEngines, restart_config

    engines = EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096)
    cfg = restart_config(RuntimeConfig(model="tiny", mode="dualpath", force_read_side="decode", engines=engines,
                                       transport=TransportConfig(kind="tcp"), device=DEVICE,
                                       faults=FaultConfig(heartbeat_timeout_s=HEARTBEAT_TIMEOUT_S)))
    assert cfg.faults.restart_wait_s == ENGINE_RESTART_WAIT_S
    ray.init(num_cpus=3, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        engines = RayEngines(ray, cfg, "", None, threads=1)
        try:
            seen = asyncio.run(conversation(cfg, engines))
        finally:
            engines.stop()
        assert engines.restarts == [0, 2]
    finally:
        ray.shutdown()
    print(f"in flight at the kill -> terminal: {seen['in_flight_s']:.2f} s; pids {seen['pid_before']} -> {seen['pid_after']}")
    assert seen["outs"] == reference(TURNS)  # the migrated turn too: greedy, so the same stream
    assert seen["restarts"] == {DECODE: 2} and seen["incarnation"] == {0: 0, DECODE: 2}
    assert len({seen["pid_before"], seen["frozen_pid"], seen["pid_after"]}) == 3
    assert seen["health"]["status"] == "ok" and seen["health"]["restarts"] == {str(DECODE): 2}
    # the bound: Ray's death report (at once) + the wait for a successor + the migrated rest
    assert seen["in_flight_s"] < ENGINE_RESTART_WAIT_S
    # turn 3 read its hit on the successor's side: its layers crossed into the PE by remote writes
    assert seen["remote_writes_after"] > seen["remote_writes_before_turn_3"]
