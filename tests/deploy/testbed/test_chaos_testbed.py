"""`dualpath chaos --testbed` (chaos/testbed.py), as root: the fault matrix across
emulated hosts. A decode engine on a host of its own frozen mid-PD transfer is found by heartbeats,
fenced through its PID, and its requests finish on the other DE with the reference's tokens; a
prefill engine told to end (SIGTERM) mid-forward says so (engine/leave.py) and its requests move
at once, well inside a heartbeat timeout; the storage service on the storage host killed mid-read
costs misses, recomputed with the same tokens. The testbed's fault-free reference equals a
single-host run's, and `down` leaves nothing. Marked slow (about 80 s: four engine CLIs start per
cluster); the full matrix is `dualpath chaos --testbed` (docs/results/chaos/chaos_testbed.json). Bad input: one
line, exit 2, also without root."""

from __future__ import annotations

import os

import pytest
from cli_helpers import cli_here


def test_testbed_chaos_refuses_the_integrity_runs():
    p = cli_here("chaos", "--testbed", "--corruptions", "10")
    assert p.returncode == 2 and "--testbed runs the engine and storage faults" in p.stderr, p.stderr[-2000:]
    assert "Traceback" not in p.stderr


@pytest.mark.slow
@pytest.mark.testbed_root
def test_faults_across_emulated_hosts_lose_nothing_and_change_no_token(tmp_path, monkeypatch):
    from dualpath.chaos.matrix import STORE_VICTIM
    from dualpath.chaos.testbed import run_chaos_testbed
    from dualpath.deploy.testbed import netns

    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    run_id = f"k{os.getpid() % 9999}"
    seen = []
    names = ["de-stop-pd", "store-kill-read", "pe-term-prefill"]
    report = run_chaos_testbed(names, num_requests=2, gen_tokens=16, run_id=run_id, on_result=seen.append,
                               log=lambda s: None)
    assert not netns.namespaces_with_prefix(f"dp{run_id}-")  # down left nothing
    assert report["reference_equals_single_host"]
    assert [r.scenario for r in seen] == names  # streamed back as each scenario ended
    frozen, store, term = report["results"]
    for r in (frozen, store, term):
        assert r["fired"], r
        assert (r["requests"], r["finished"], r["errored"], r["lost"], r["wrong_tokens"]) == (2, 2, 0, 0, 0), r
        assert r["writes_pending"] == 0 and r["recovery_s"] < 30.0, r
    assert frozen["victim"] in (2, 3)  # a DE's place (2P2D: engines 0-1 prefill, 2-3 decode)
    # found by heartbeats, not at once: no exit watch sees another host's process
    assert frozen["recovery_s"] >= report["config"]["heartbeat_timeout_s"] * 0.9, frozen
    assert term["victim"] in (0, 1)
    assert term["recovery_s"] < report["config"]["heartbeat_timeout_s"] / 2, term  # Leaving, not a timeout
    assert store["victim"] == STORE_VICTIM and store["store_faults"]["engine_skipped_calls"] >= 1, store
    assert report["config"]["testbed"]["cnic_bytes_per_s"] > 0
