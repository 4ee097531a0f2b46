"""`dualpath chaos` in the default run: every victim (prefill engine, decode engine, storage service)
and every fault kind (kill, terminate, freeze) plays one scenario, judged by the chaos harness's own
report (chaos/matrix.py: ChaosResult): every turn-2 request finished with the fault-free
tokens, none lost, none errored.

One 2P2D cluster (tiny model) against the storage service serves the fault-free reference, then
three scenarios in turn, as the harness's `play_scenario` allows on a started cluster; each takes
one engine or the service, so each leaves a survivor of every role for the next:
  1. pe-term-pd: a PE terminated in its PD transfer (it leaves, telling the router; the other PE
     serves on);
  2. de-stop-decode: a DE frozen mid-decode, fenced after the heartbeat timeout (its requests
     finish on the other DE; the fence kills it, so the harness's SIGCONT finds it dead);
  3. store-kill-read: the service killed while turn-2 hits are to be read from it (the reads are
     misses, recomputed with the same tokens; the persists after it fail, counted).
The cluster runs with every scenario's widened window at once (the slow CNIC of `pd`, the store
read delay of `store-*-read`: `scenario_config` changes nothing for any of the three), which
changes timing only. A short heartbeat timeout keeps the freeze quick. `dualpath chaos` runs each
scenario on a fresh cluster instead (run_scenario): the full matrix is `slow` in test_chaos.py."""

from __future__ import annotations

import asyncio
import math
import signal

from dualpath.chaos.matrix import (
    SCENARIOS, SLOW_CNIC_BYTES_PER_S, STORE_READ_DELAY_S, STORE_VICTIM, chaos_config, local_signaller, play_scenario,
    reference_run, scenario_config,
)
from dualpath.chaos.store_victim import ServiceChild
from dualpath.runtime.cluster import LocalCluster
from dualpath.runtime.protocol import HEARTBEATS_PER_TIMEOUT

HEARTBEAT_TIMEOUT_S = 1.5  # 7.5x the 0.2 s beat interval, as test_engine_faults.py's frozen-DE test
NUM_REQUESTS = 2
GEN_TOKENS = 16  # as test_chaos.py's store and PD-transfer test: a decode window the harness's 1 ms poll sees
PLAYED = ("pe-term-pd", "de-stop-decode", "store-kill-read")  # in this order: the store goes last


async def _one_cluster(service: ServiceChild) -> dict:
    cfg = chaos_config("tiny", "recompute", changes={
        "faults.heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S, "store.location": service.url,
        "links.cnic_bytes_per_s": SLOW_CNIC_BYTES_PER_S, "faults.store_read_delay_s": STORE_READ_DELAY_S})
    assert all(scenario_config(cfg, name) == cfg for name in PLAYED)  # each scenario's own configuration
    results, fenced = [], {}
    async with LocalCluster(cfg) as cluster:
        reference = await reference_run(cluster, NUM_REQUESTS, GEN_TOKENS)
        send = local_signaller(cluster, service)
        for name in PLAYED:
            results.append(await play_scenario(cluster, send, name, reference, GEN_TOKENS))
            if name == "de-stop-decode":
                process = cluster.processes[results[-1].victim]
                await asyncio.to_thread(process.join, 10)
                fenced = {"cause": cluster.router.liveness.down.get(results[-1].victim, ""),
                          "exitcode": process.exitcode}
    return {"results": results, "fenced": fenced}


def test_each_victim_and_each_fault_kind_loses_nothing_and_changes_no_token():
    assert set(PLAYED) <= set(SCENARIOS)
    assert {n.split("-")[0] for n in PLAYED} == {"pe", "de", "store"}
    assert {n.split("-")[1] for n in PLAYED} == {"kill", "stop", "term"}
    with ServiceChild() as service:
        out = asyncio.run(_one_cluster(service))
    results = out["results"]
    for name, r in zip(PLAYED, results):
        assert r.scenario == name and r.fired, r  # the moment came and the victim got its signal
        assert (r.requests, r.finished, r.errored, r.lost, r.wrong_tokens) == (NUM_REQUESTS, NUM_REQUESTS, 0, 0, 0), r
        assert r.writes_pending == 0 and r.recovery_s < 30.0, r
    left_pe, frozen_de, store = results
    assert left_pe.victim in (0, 1) and frozen_de.victim in (2, 3) and store.victim == STORE_VICTIM
    assert left_pe.store_faults["persist_failures"] == 0  # the service was healthy until the last scenario
    # the frozen DE held a request; it was found by missed heartbeats, never before the timeout less one
    # beat interval, and fenced for good
    assert not math.isnan(frozen_de.recovery_s)
    assert frozen_de.recovery_s > HEARTBEAT_TIMEOUT_S * (1 - 1 / HEARTBEATS_PER_TIMEOUT) - 0.05, frozen_de
    assert out["fenced"]["cause"].startswith("sent no heartbeat for"), out["fenced"]
    assert out["fenced"]["exitcode"] == -signal.SIGKILL
    # the killed service: persists after it fail and are counted, engines skip their calls
    assert store.store_faults["persist_failures"] >= 1 and store.store_faults["engine_skipped_calls"] >= 1, store
