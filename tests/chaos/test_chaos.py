"""`dualpath chaos` (chaos/matrix.py): bad input is one line and exit 2; a scenario on a real
2P2D cluster (tiny model) ends every request finished with the reference's tokens or errored; the
storage service as the victim (chaos/store_victim.py) and the PD-transfer moment; every victim and fault kind
in the default run is test_chaos_kinds.py."""

from __future__ import annotations

import json
import subprocess

import pytest
from cli_helpers import cli, cli_here

from dualpath.chaos.matrix import SCENARIOS, STORE_VICTIM, parse_scenarios, run_chaos
from dualpath.runtime.transport.mooncake import mooncake_loads


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return cli("chaos", *args, timeout=timeout)


def test_the_matrix_and_bad_input():
    assert len(SCENARIOS) == 33 and parse_scenarios(["all"]) == list(SCENARIOS)
    assert {s.split("-")[0] for s in SCENARIOS} == {"pe", "de", "store"}
    assert {s.split("-")[1] for s in SCENARIOS} == {"kill", "term", "stop"}
    assert {s.split("-", 2)[2] for s in SCENARIOS} == {"read", "stream", "prefill", "pd", "decode", "persist"}
    assert {s for s in SCENARIOS if s.startswith("store-")} == {
        f"store-{sig}-{m}" for sig in ("kill", "term", "stop") for m in ("read", "persist")}
    for args, needle in ((("--scenario", "de-kill-lunch"), "unknown scenario"), (("--policy", "pray"), "--policy"),
                         (("--requests", "0"), "positive"), (("--transfer", "pigeon"), "--transfer must be one of"),
                         (("--transfer", "mooncake", "--corruptions", "3"), "not with --corruptions")):
        p = cli_here("chaos", *args)
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_frozen_decode_engine_loses_nothing_and_changes_no_token(tmp_path, policy):
    out = tmp_path / "c.json"
    p = _cli("--scenario", "de-stop-decode", "--policy", policy, "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    (r,) = json.loads(out.read_text())["results"]
    assert r["fired"] and r["requests"] == 4 and r["lost"] == 0 and r["wrong_tokens"] == 0
    assert r["finished"] + r["errored"] == 4
    if policy == "recompute":
        assert r["finished"] == 4  # the other DE takes the victim's requests
    else:
        assert r["errored"] >= 1  # the victim's requests end with the error the client sees


def _assert_clean(results: list[dict], names: list[str], requests: int = 4) -> None:
    assert [r["scenario"] for r in results] == names
    for r in results:
        assert r["fired"], r  # the moment came and the victim got its signal
        assert (r["requests"], r["finished"], r["errored"], r["lost"], r["wrong_tokens"]) == (requests, requests, 0, 0, 0), r
        assert r["writes_pending"] == 0 and r["recovery_s"] < 30.0, r


@pytest.mark.slow  # 3 clusters; the default run plays store-kill-read (and pe-term-pd) on one: test_chaos_kinds.py
def test_a_killed_storage_service_and_a_killed_pe_mid_transfer_lose_nothing():
    """The service dies while turn-2 hits are to be read from it: the reads are misses, recomputed
    with the same tokens, and the persists after it fail, counted; a PE dies in its PD transfer."""
    import asyncio

    names = ["store-kill-read", "pe-kill-pd"]
    results = asyncio.run(run_chaos(names, num_requests=2, gen_tokens=16))["results"]
    _assert_clean(results, names, requests=2)
    store, pd = results
    assert store["victim"] == STORE_VICTIM and pd["victim"] in (0, 1)
    assert store["store_faults"]["persist_failures"] >= 1 and store["store_faults"]["engine_skipped_calls"] >= 1
    assert pd["store_faults"]["persist_failures"] == 0


@pytest.mark.slow
def test_frozen_service_and_the_new_engine_moments_lose_nothing():
    import asyncio

    names = ["store-stop-read", "store-stop-persist", "store-term-persist", "de-stop-persist", "de-kill-stream",
             "pe-stop-stream", "de-term-pd"]
    results = asyncio.run(run_chaos(names))["results"]
    _assert_clean(results, names)
    frozen = results[0]
    assert frozen["store_faults"]["engine_skipped_calls"] >= 1  # the breaker answered after the first timeout


@pytest.mark.skipif(not mooncake_loads(), reason="Mooncake Transfer Engine does not load here")
def test_a_decode_engine_killed_mid_stream_with_the_kv_through_mooncake_loses_nothing():
    """`chaos --transfer mooncake`: the DE dies while its Mooncake writes stream a layer to the PE;
    the PE's wait ends (an error, never a hang) and the request recovers with the reference's tokens."""
    import asyncio

    from dualpath.cli.runtime import transfer_overrides

    report = asyncio.run(run_chaos(["de-kill-stream"], num_requests=2, gen_tokens=16,
                                   overrides=transfer_overrides("mooncake")))
    assert report["config"]["transport"] == {"kind": "tcp", "transfer": "mooncake"}
    _assert_clean(report["results"], ["de-kill-stream"], requests=2)
