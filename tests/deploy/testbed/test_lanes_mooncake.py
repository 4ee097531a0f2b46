"""`bench lanes --testbed --bulk mooncake` (root): latency-critical bursts beside KV that Mooncake
Transfer Engine moves between two testbed hosts. Its unmarked TCP takes the port's KV class, so with
the two classes a burst waits for no KV, and with one class it queues behind it; the DE host's
class counters show where the bulk went. Bad input is one line, exit 2."""

from __future__ import annotations

import os

import pytest
from cli_helpers import cli_here

from dualpath.runtime.transport.mooncake import mooncake_loads


@pytest.mark.testbed_root
@pytest.mark.skipif(not mooncake_loads(), reason="Mooncake Transfer Engine does not load here")
def test_bursts_keep_their_lane_beside_mooncakes_kv(tmp_path, monkeypatch):
    from dualpath.deploy.testbed import netns
    from dualpath.deploy.testbed.lanes_bench import BULK_WRITE_BYTES, BURST_BYTES, run_lanes_testbed

    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    run_id = f"m{os.getpid() % 9999}"
    bursts = 60
    r = run_lanes_testbed(32e6, bursts, run_id=run_id, bulk="mooncake")
    assert not netns.namespaces_with_prefix(f"dp{run_id}-")
    c = r["de_port_class_bytes"]
    burst_bytes = 2 * bursts * BURST_BYTES  # the bursts of the unloaded and two-class runs
    # the LC class carries the bursts and their headers only, Mooncake's bulk (at least one write) the KV class
    assert burst_bytes <= c["lc"] <= 1.25 * burst_bytes and c["kv"] >= BULK_WRITE_BYTES, c
    # two classes: a burst does not queue behind the KV (unloaded-like); one class: it does
    assert r["p50_over_unloaded"]["two_classes"] < 1.5, r["runs"]
    assert r["p50_over_unloaded"]["one_class"] > 3.0, r["runs"]


def test_bulk_is_checked_before_anything_starts():
    for args, needle in ((("--testbed", "--bulk", "pigeon"), "--bulk must be tcp or mooncake"),
                         (("--bulk", "mooncake"), "--bulk is a --testbed option")):
        p = cli_here("bench", "lanes", *args)
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
