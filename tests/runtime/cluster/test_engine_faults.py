"""Engine faults on a real local cluster (tiny model, real engine processes; runtime/router/
liveness.py and recovery.py): a killed or frozen engine is detected, its requests migrate with the
tokens streamed so far (policy `recompute`) and finish with exactly the tokens of a fault-free run,
or end with an error the client sees; /health names the dead engine; nothing hangs.

The default run has one 1P2D cluster lose a DE (SIGKILL: its requests migrate, their DE-path reads
moving to the PE path), then the last DE mid-stream (an SSE error event, /health 503, new requests
503). `slow` (a cluster each, ~15-30 s to start on 2 cores): SIGSTOP of a DE (fenced by heartbeats,
SIGCONT finds it dead); policy `fail`; a PE killed mid-prefill (SIGKILL, then SIGTERM of the last);
a DE killed before its DE-path read; a DE killed while the PE's forward waits for its layers."""

from __future__ import annotations

import asyncio
import signal
import time

import httpx
import pytest

from dualpath.core.phase import Phase

from dualpath.runtime.protocol import HEARTBEATS_PER_TIMEOUT
from fault_harness import EXIT_BOUND_S, GEN_TOKENS, PROMPTS, Served, config, first_decoding_de, greedy_all, sse_until_error

HEARTBEAT_TIMEOUT_S = 1.5  # short, so the SIGSTOP step is quick; 7.5x the 0.2 s beat interval
# detection of a frozen engine: the timeout, one check interval late at most, plus a loaded machine's slack
STOP_BOUND_S = HEARTBEAT_TIMEOUT_S * (1 + 1 / HEARTBEATS_PER_TIMEOUT) + 1.0


def _wait_idle(served: Served, timeout_s: float = 20.0) -> None:
    """Until every record has left the router (a survivor reports the cancelled attempts), then the
    ledgers must balance."""
    deadline = time.monotonic() + timeout_s
    while served.on_loop(lambda: len(served.router.requests)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert served.on_loop(lambda: dict(served.router.requests)) == {}
    served.on_loop(served.router.check_invariants)


@pytest.fixture(scope="module")
def served():
    # every read on the DE side, so that the migrated requests' reads show the fallback to the PE path
    s = Served(config(num_decode=2, force_read_side="decode"))
    yield s
    s.close()


def test_a_killed_de_migrates_its_requests_and_the_last_one_errors_the_stream(served):
    router = served.router
    reference = served.run(greedy_all(router))
    assert all(len(r) == GEN_TOKENS for r in reference)

    # 1. SIGKILL of a DE while greedy requests decode on it: every request finishes, tokens identical
    victims: dict[str, set[int]] = {}

    async def kill_a_decoding_de():
        de, streams = await first_decoding_de(router)
        victims["kill"] = streams
        served.kill(de)
        victims["kill_de"] = {de}

    assert served.run(greedy_all(router, kill_a_decoding_de)) == reference
    (killed,) = victims["kill_de"]
    assert victims["kill"] and router.metrics.num_migrated == len(victims["kill"])
    # the retries hit what the reference round persisted; their DE-path read fell back to the PE path
    read = router.metrics.summary()["bytes"]
    assert read["storage_via_decode"] > 0 and read["storage_to_prefill"] > 0
    health = httpx.get(served.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "degraded"
    assert health.json()["down"] == [{"engine": killed, "role": "decode", "cause": "killed by SIGKILL"}]
    _wait_idle(served)

    # 2. SIGKILL of the last DE mid-stream: an SSE error event, then the end of the stream
    (last,) = {e for e, s in served.on_loop(lambda: {e: router.liveness.is_alive(e) for e in router.engines}).items()
               if s and router.engines[e].role == "decode"}
    body = {"messages": [{"role": "user", "content": "count to a thousand " * 4}], "max_tokens": 3000, "stream": True,
            "temperature": 0, "ignore_eos": True, "min_tokens": 3000}
    events, tail_s = sse_until_error(served.url, body, lambda n: served.kill(last) if n == 5 else None)
    assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "engine_unavailable"
    assert f"decode engine {last} killed by SIGKILL" in events[-2]["error"]["message"]
    assert tail_s < EXIT_BOUND_S
    health = httpx.get(served.url + "/health")
    assert health.status_code == 503 and health.json()["status"] == "unavailable"
    assert {d["engine"] for d in health.json()["down"]} == {killed, last}
    t0 = time.monotonic()
    r = httpx.post(served.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=30)
    assert r.status_code == 503 and time.monotonic() - t0 < 2.0
    assert r.json()["error"]["code"] == "engine_unavailable"
    assert r.json()["error"]["message"].startswith("no engine can serve it: ") and f"decode engine {last} killed by SIGKILL" in r.json()["error"]["message"]
    _wait_idle(served)


@pytest.mark.slow
def test_a_frozen_de_is_fenced_within_the_heartbeat_timeout_and_stays_dead():
    """SIGSTOP: detected by missed heartbeats within the stated bound; the requests migrate and
    finish with the reference tokens; the engine is killed (fenced for good), so SIGCONT finds no
    process and nothing it held can be overwritten by it; the survivor serves on."""
    served = Served(config({"faults.heartbeat_timeout_s": HEARTBEAT_TIMEOUT_S}, num_decode=2))
    try:
        router = served.router
        reference = served.run(greedy_all(router))
        stopped: dict[str, float] = {}

        async def stop_a_decoding_de():
            de, streams = await first_decoding_de(router)
            served.kill(de, signal.SIGSTOP)
            stopped["engine"], stopped["at"], stopped["streams"] = de, time.monotonic(), streams
            while router.liveness.is_alive(de):
                await asyncio.sleep(0.01)
            stopped["detected_s"] = time.monotonic() - stopped["at"]

        assert served.run(greedy_all(router, stop_a_decoding_de)) == reference
        frozen = stopped["engine"]
        # the last beat came at most one interval before the stop: never fenced before timeout - interval
        assert HEARTBEAT_TIMEOUT_S * (1 - 1 / HEARTBEATS_PER_TIMEOUT) - 0.05 < stopped["detected_s"] < STOP_BOUND_S
        assert served.on_loop(lambda: router.liveness.down[frozen]).startswith("sent no heartbeat for")
        assert router.metrics.num_migrated == len(stopped["streams"]) > 0
        proc = served.cluster.processes[frozen]
        proc.join(5)
        assert proc.exitcode == -signal.SIGKILL
        with pytest.raises(ProcessLookupError):
            served.kill(frozen, signal.SIGCONT)
        _wait_idle(served)
        assert served.run(greedy_all(router)) == reference  # the survivor serves on, uncorrupted
        assert httpx.get(served.url + "/health").json()["status"] == "degraded"
    finally:
        served.close()


@pytest.mark.slow
def test_policy_fail_ends_the_requests_of_a_killed_de_with_errors_not_retries():
    served = Served(config({"faults.policy": "fail"}, num_decode=2))
    try:
        router = served.router
        reference = served.run(greedy_all(router))
        hit: dict[str, set[int]] = {}

        async def kill_a_decoding_de():
            de, streams = await first_decoding_de(router)
            served.kill(de)
            hit["streams"], hit["de"] = streams, {de}

        got = served.run(greedy_all(router, kill_a_decoding_de))
        (de,) = hit["de"]
        rids = sorted(served.on_loop(lambda: router.metrics.reqs))[-len(got):]  # this round's stream ids, in order
        for rid, tokens, ref in zip(rids, got, reference):
            if rid in hit["streams"]:
                assert tokens[0] == "error" and tokens[2] < GEN_TOKENS
                assert f"decode engine {de} killed by SIGKILL" in tokens[1] and "faults.policy is fail" in tokens[1]
            else:
                assert tokens == ref
        assert router.metrics.num_migrated == 0 and router.metrics.num_failed == len(hit["streams"]) > 0
        _wait_idle(served)
        assert served.run(greedy_all(router)) == reference  # the other DE serves on
    finally:
        served.close()


async def _stall_then_kill(served: Served, stall: list[int], role: str = "pe", sig: int = signal.SIGKILL) -> tuple[int, set[int]]:
    """With the engines in `stall` (all of one role) stopped, wait until every request of the round
    is placed (its assignments sent, waiting unread: before the read and the prefill), then kill
    the engine holding the most with `sig` and SIGCONT the others (and the victim, for a SIGTERM,
    which a stopped process acts on when continued). Returns (the victim, the stream ids on it)."""
    router = served.router
    for e in stall:
        served.kill(e, signal.SIGSTOP)
    while True:
        live = [rr for rr in router.requests.values() if not rr.finished]
        if len(live) == len(PROMPTS) and all(rr.placed for rr in live):
            break
        await asyncio.sleep(0.005)
    victim = max(stall, key=lambda e: sum(getattr(rr, role).engine == e for rr in live))
    streams = {rr.stream_rid for rr in live if getattr(rr, role).engine == victim}
    served.kill(victim, sig)
    for e in stall:
        if e != victim or sig != signal.SIGKILL:
            served.kill(e, signal.SIGCONT)
    return victim, streams


@pytest.mark.slow
def test_a_pe_killed_mid_prefill_migrates_its_requests_and_the_last_one_errors_them():
    """SIGKILL of one PE of two with requests assigned to it and not yet prefilled: they migrate to
    the other and finish with the reference tokens; SIGTERM of the last PE: every request errors,
    /health and new requests say 503."""
    served = Served(config(num_prefill=2))
    try:
        router = served.router
        reference = served.run(greedy_all(router))
        out: dict = {}

        async def kill_one_of_two():
            out["first"] = await _stall_then_kill(served, [0, 1])

        assert served.run(greedy_all(router, kill_one_of_two)) == reference
        victim, streams = out["first"]
        assert router.metrics.num_migrated == len(streams) > 0
        assert httpx.get(served.url + "/health").json()["down"] == [{"engine": victim, "role": "prefill", "cause": "killed by SIGKILL"}]
        _wait_idle(served)

        (last,) = {0, 1} - {victim}

        async def kill_the_last():
            out["last"] = await _stall_then_kill(served, [last], sig=signal.SIGTERM)

        got = served.run(greedy_all(router, kill_the_last))
        assert all(g[0] == "error" and g[2] == 0 and f"prefill engine {last} killed by SIGTERM" in g[1] for g in got)
        health = httpx.get(served.url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        r = httpx.post(served.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=30)
        assert r.status_code == 503 and "prefill" in r.json()["error"]["message"]
        _wait_idle(served)
    finally:
        served.close()


@pytest.mark.slow
def test_a_de_killed_before_its_de_path_read_migrates_to_the_pe_path():
    """The DE dies with the hits of its requests still to read (DE path): the PE, waiting for that
    DE's HitReady, drops them on the router's Cancel; they migrate to the other DE and read on the
    PE side; the tokens are the reference's."""
    served = Served(config(num_decode=2, force_read_side="decode"))
    try:
        router = served.router
        reference = served.run(greedy_all(router))  # fresh store: no reads; its KV is persisted
        out: dict = {}

        async def kill_a_stalled_de():
            out["victim"] = await _stall_then_kill(served, [1, 2], role="de")

        assert served.run(greedy_all(router, kill_a_stalled_de)) == reference
        victim, streams = out["victim"]
        assert router.metrics.num_migrated == len(streams) > 0
        read = router.metrics.summary()["bytes"]
        assert read["storage_to_prefill"] > 0  # only the migrated requests read on the PE side
        _wait_idle(served)
    finally:
        served.close()


@pytest.mark.slow
def test_a_de_killed_while_the_pe_waits_for_its_layers_lets_the_forward_go_on():
    """DE path with a slow CNIC (200 kB/s): the PE's forward waits for the DE's layer copies
    (`LayerPull` -> `LayerReady`) when the DE dies; `EngineDown` lets the forward go on without
    them (those items are cancelled), the PE serves on, the requests migrate, tokens identical."""
    served = Served(config({"links.cnic_bytes_per_s": 200e3}, num_decode=2, force_read_side="decode"))
    try:
        router = served.router
        reference = served.run(greedy_all(router), timeout_s=300)
        out: dict = {}

        async def kill_during_layer_pulls():
            while True:  # the DE read is done (ReadDone), the first token is not: the PE is in its forward
                waiting = [rr for rr in router.requests.values() if rr.phase is Phase.PREFILL_READY and rr.hit_tokens
                           and not rr.finished]
                if waiting:
                    break
                await asyncio.sleep(0.002)
            await asyncio.sleep(0.05)
            out["de"] = waiting[0].de.engine
            served.kill(out["de"])

        assert served.run(greedy_all(router, kill_during_layer_pulls), timeout_s=300) == reference
        assert router.metrics.num_migrated >= 1
        _wait_idle(served, timeout_s=60)
    finally:
        served.close()


def test_across_hosts_a_killed_de_costs_its_peers_nothing():
    """transport.kind tcp (remote writes, engine/peers.py): a DE killed while its requests
    decode breaks the PE's connections to it; the PE counts the failures and lives on, the requests
    migrate to the other DE and finish with the fault-free tokens."""
    served = Served(config({"transport.kind": "tcp"}, num_decode=2, force_read_side="decode"))
    try:
        router = served.router
        reference = served.run(greedy_all(router))

        async def kill_a_decoding_de():
            de, _ = await first_decoding_de(router)
            served.kill(de)

        assert served.run(greedy_all(router, kill_a_decoding_de)) == reference
        assert served.cluster.processes[0].is_alive()  # the PE wrote to a dead peer and lives on
        assert served.run(greedy_all(router)) == reference  # and serves on, through the survivor
        assert router.metrics.num_migrated >= 1
        _wait_idle(served)
    finally:
        served.close()
