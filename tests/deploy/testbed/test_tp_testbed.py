"""Tensor-parallel collectives on the testbed (deploy/testbed/tp_hosts.py): rank 1 on a host of its own, its gloo
traffic with rank 0 counted by the kernel in the latency-critical class 1:10 on the DE's CNIC
link, KV on the same link in 1:20, and the tokens of one process (root; skipped elsewhere)."""

from __future__ import annotations

import os

import pytest

from dualpath.deploy.testbed.plan import plan_testbed
from dualpath.deploy.testbed.tp_hosts import tp_filter_commands, tp_host_of, with_tp_hosts

MB = 1e6


def test_the_tp_host_has_a_cnic_link_only_and_filters_cover_the_pair_both_ways():
    plan = with_tp_hosts(plan_testbed("x1", 1, 1, 4 * MB, 32 * MB, run_index=7), ("dpx1-d0",))
    tp = tp_host_of("dpx1-d0")
    assert plan.tp_hosts == (tp,) and tp in plan.namespaces and plan.cnic_addr_of[tp] == "10.232.7.101"
    assert [x.name for x in plan.links if x.host == tp] == ["cnic"]
    cmds = [" ".join(c) for c in tp_filter_commands(plan, "dpx1-d0")]
    assert len(cmds) == 8  # 4 ends x 2 directions
    assert sum("src 10.232.7.2/32 match ip dst 10.232.7.101/32 flowid 1:10" in c for c in cmds) == 4


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.mark.testbed_root
def test_collectives_land_in_the_lc_class_and_kv_in_the_kv_class(state_dir):
    from dualpath.deploy.testbed.tp_lanes_bench import TpDecode, de_class_bytes
    from dualpath.deploy.testbed.netns import down, namespaces_with_prefix, run_command, up
    from dualpath.deploy.testbed.probe import transfer

    plan = with_tp_hosts(plan_testbed(f"q{os.getpid() % 10000}", 1, 1, 8 * MB, 64 * MB, run_index=245),
                         (f"dpq{os.getpid() % 10000}-d0",))
    pe, de = plan.hosts
    kv_bytes = 4_000_000
    up(plan)
    dec = None
    try:
        for cmd in tp_filter_commands(plan, de):
            run_command(cmd)
        before = de_class_bytes(plan, de)
        dec = TpDecode(plan, de, "tiny", batch=4)
        assert dec.ready["same_tokens"] is True
        r = dec.measure("steps", 20)
        dec.close()
        kv = transfer(pe, de, plan.cnic_addr_of[de], kv_bytes, dscp=8)  # PE -> DE: into the DE host
        after = de_class_bytes(plan, de)
    finally:
        if dec is not None:
            dec.close()
        down(plan.run_id)
    assert namespaces_with_prefix(f"dp{plan.run_id}-") == []
    d = {side: {k: after[side][k] - before[side][k] for k in after[side]} for side in after}
    collective_bytes = r["payload_bytes"]  # 20 steps, but the rendezvous and checks add more
    # rank 0 sends each broadcast whole and half of each all_reduce's partial both ways
    assert d["out"]["lc_class_bytes"] >= collective_bytes / 2
    assert d["in"]["lc_class_bytes"] >= collective_bytes / 4
    assert d["in"]["kv_class_bytes"] >= kv.payload_bytes  # the KV flow took the KV class ...
    assert d["in"]["lc_class_bytes"] < kv.payload_bytes / 4  # ... not the LC one
    assert d["out"]["kv_class_bytes"] < d["out"]["lc_class_bytes"]  # out: only the KV flow's ACKs


@pytest.mark.slow  # ~20 s: six measurements and three model loads
@pytest.mark.testbed_root
def test_tp_lanes_bench_fifo_inflates_tpot_and_the_lanes_do_not(state_dir):
    """A tiny `bench tp-lanes`: the structure of its result, the classes' bytes, and the ordering,
    which holds with a wide margin (x0.97 vs x11 on the shared 2-core machine,
    docs/results/testbed/tp_lanes_tiny.json)."""
    from dualpath.deploy.testbed.tp_lanes_bench import LOADS, run_tp_lanes

    r = run_tp_lanes("tiny", batch=4, steps=12, run_id=f"b{os.getpid() % 10000}", rounds=1)
    assert r["same_tokens"] is True and r["wire_bytes_per_step"] >= r["payload_bytes_per_step"]
    assert r["cnic_bytes_per_s"] == pytest.approx(r["wire_bytes_per_step"] / (0.25 * r["calibration_step_s"]))
    assert set(r["runs"]) == {f"{load}_{c}" for load in LOADS for c in ("two_classes", "one_class")}
    for name, run in r["runs"].items():
        out = run["kernel"]["out"]
        if name.endswith("two_classes"):  # the collectives in 1:10; KV only when it crosses the DE's CNIC
            assert out["lc_class_bytes"] >= run["payload_bytes"] / 2
            assert (out["kv_class_bytes"] > out["lc_class_bytes"]) == name.startswith("saturated")
        else:  # one class: everything in 1:20
            assert out["lc_class_bytes"] == 0 and out["kv_class_bytes"] >= run["payload_bytes"] / 2
    two, one = r["tpot_saturated_over_idle"]["two_classes"], r["tpot_saturated_over_idle"]["one_class"]
    assert two < 2.0 and one > 2 * two
    assert all(run["prefills"] == 2 and run["ttft_mean_s"] > 0 for run in r["runs"].values())
    ttft = r["ttft_saturated_over_idle"]  # a prefill's collectives are larger: FIFO slows them more
    assert ttft["one_class"] > ttft["two_classes"]
    one_round = r["paired_by_round"]["one_class"]["saturated_over_idle"]  # rounds=1: the pooled ratio itself
    assert one_round["per_round"] == [pytest.approx(one)] and one_round["median"] == pytest.approx(one)


def test_paired_ratios_are_taken_round_by_round():
    """TPOT under a load over its own round's base: a machine that slows down between rounds
    (round 2 twice as slow for both) leaves each round's ratio, and so the median, unchanged."""
    from dualpath.deploy.testbed.tp_lanes_bench import paired_ratio

    base = [{"step_s": [0.10, 0.10]}, {"step_s": [0.20, 0.20]}, {"step_s": [0.10, 0.12]}]
    loaded = [{"step_s": [0.105, 0.105]}, {"step_s": [0.21, 0.21]}, {"step_s": [0.165, 0.165]}]
    r = paired_ratio(loaded, base)
    assert r["per_round"] == pytest.approx([1.05, 1.05, 1.5])
    assert r["median"] == pytest.approx(1.05)
    assert r["ci95"][0] <= r["median"] <= r["ci95"][1] and r["ci95"][1] <= 1.5
    assert paired_ratio(loaded, base) == r  # seeded: the same interval every time
    pooled = sum(sum(x["step_s"]) for x in loaded) / sum(sum(x["step_s"]) for x in base)
    assert pooled == pytest.approx(0.96 / 0.82)  # the pooled mean of the same rounds: x1.17


def test_bench_tp_lanes_bad_input_is_one_error_line():
    from cli_helpers import cli_here

    for args in ((), ("--testbed", "--steps", "5"), ("--testbed", "--gso-kib", "1"), ("--testbed", "--rounds", "30"),
                 ("--testbed", "--bulk-copy", "--bulk-mooncake")):
        r = cli_here("bench", "tp-lanes", *args)
        assert r.returncode == 2 and r.stderr.startswith("error:") and r.stderr.strip().count("\n") == 0, (args, r.stderr)
