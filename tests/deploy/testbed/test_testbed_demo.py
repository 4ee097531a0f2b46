"""The demo across the testbed's emulated hosts (deploy/testbed/demo.py), as root: engines
started with `dualpath engine` in their own namespaces, the router in its own, the store a
service on the storage host; every byte of KV crosses a veth link whose rate tc enforces.
Small (tiny model, 2 agents x 4 rounds, dualpath mode: both read paths) so that it runs in CI;
both modes with SmolLM2 are in docs/results/testbed/demo.json."""

from __future__ import annotations

import os

import pytest

from dualpath.runtime.store.format import HEADER_BYTES
from dualpath.runtime.transport.mooncake import mooncake_loads

MB = 1e6


@pytest.mark.testbed_root
@pytest.mark.parametrize("transfer", ["remote-write", pytest.param("mooncake", marks=pytest.mark.skipif(
    not mooncake_loads(), reason="Mooncake Transfer Engine does not load here"))])
def test_the_demo_across_emulated_hosts_gives_the_single_host_tokens_and_the_kernel_sees_the_ledger(tmp_path, monkeypatch,
                                                                                                  transfer):
    from dualpath.deploy.testbed import netns
    from dualpath.deploy.testbed.demo import cnic_framing_bytes, ledger_vs_kernel, run_testbed_demo

    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    result = run_testbed_demo(model="tiny", agents=2, rounds=4, snic_bytes_per_s=2 * MB, run_id=f"t{os.getpid() % 9999}",
                              log=lambda line: None, modes=("dualpath",), transfer=transfer)
    assert result["config"]["transfer"] == transfer
    assert not netns.namespaces_with_prefix(f"dpt{os.getpid() % 9999}-")  # down left nothing
    (dual,) = result["runs"]
    assert dual["tokens_sha256"] == result["reference_tokens_sha256"]  # the tokens: identical to one host's
    hosts = result["config"]["testbed"]["hosts"]
    assert set(dual["tcp"]) == {result["config"]["testbed"]["storage_ns"], *hosts}  # every host's TCP counters
    assert all(t["retrans_segs"] <= 0.01 * t["out_segs"] for t in dual["tcp"].values()), dual["tcp"]  # links that drop nothing
    # hits read on both hosts: through the PE's SNIC and through the DE's, then over the fabric
    assert dual["bytes"]["storage_to_prefill"] > 0 and dual["bytes"]["storage_via_decode"] > 0
    assert result["config"]["full_block_bytes"] == 64 * 1024  # tiny: 64 tokens x 1 KiB of KV per token
    rows = ledger_vs_kernel(result)
    assert {r["what"].split(" (")[0] for r in rows if r["runtime_bytes"] >= MB / 2} == {"SNIC read", "SNIC write", "CNIC out"}
    for row in rows:
        if row["runtime_bytes"] < MB / 2:
            continue  # a link that carried only control messages and acks
        # stated: the runtime's bytes + each block file's 4 KiB header on reads; on the CNIC + the
        # engine's encoded messages to the router and its peers (more of them the longer a run lasts)
        control = result["runs"][0]["ledger"][str(result["config"]["testbed"]["hosts"].index(row["host"]))]["control_bytes"]
        assert row["stated_bytes"] == row["runtime_bytes"] + (row["runtime_bytes"] // 65536 * HEADER_BYTES
                                                              if row["what"].startswith("SNIC read") else
                                                              control if row["what"].startswith("CNIC") else 0)
        if row["what"].startswith("CNIC"):
            assert control > 0  # tokens and counters at the least
        framing = cnic_framing_bytes(row)
        if framing is not None:
            # the CNIC: less one 66-byte Ethernet + IPv4 + TCP header per packet the port sent (data
            # or ack; a GSO burst is one), the transport's own framing: within 2% for either transfer
            assert 0 <= framing <= 0.02 * row["stated_bytes"], row
            continue
        # what the kernel adds: TCP/IP and the storage protocol's frames, within 2%
        assert row["stated_bytes"] <= row["kernel_bytes"] <= 1.02 * row["stated_bytes"], row


@pytest.mark.testbed_root
def test_the_demo_with_tp2_ranks_on_hosts_of_their_own_keeps_the_tokens_and_the_ledger(tmp_path, monkeypatch):
    """`demo --testbed --tp 2`: each engine's rank 1 on an emulated host of its own, across the
    node's CNIC link; the single-host run (one process per engine) gives the tokens."""
    from dualpath.deploy.testbed import netns
    from dualpath.deploy.testbed.demo import collectives_vs_kernel, ledger_vs_kernel, run_testbed_demo

    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    run_id = f"p{os.getpid() % 9999}"
    result = run_testbed_demo(model="tiny", agents=2, rounds=3, snic_bytes_per_s=2 * MB, run_id=run_id,
                              log=lambda line: None, modes=("dualpath",), tp=2)
    assert not netns.namespaces_with_prefix(f"dp{run_id}-")  # the rank-1 hosts went with the rest
    (dual,) = result["runs"]
    assert dual["tokens_sha256"] == result["reference_tokens_sha256"]
    assert sorted(result["config"]["testbed"]["tp_hosts"]) == sorted(f"{h}t" for h in result["config"]["testbed"]["hosts"])
    cnic = [r for r in ledger_vs_kernel(result) if r["what"].startswith("CNIC") and r["runtime_bytes"] >= MB / 2]
    # rank 1's bytes taken out; TCP/IP and frames, and at most an ack per segment that came in
    assert cnic and all(r["stated_bytes"] <= r["kernel_bytes"] <= 1.02 * r["stated_bytes"] + r["kernel_in_bytes"] * 66 / 1448
                        for r in cnic), cnic
    pe = next(r for r in collectives_vs_kernel(result) if r["host"] == result["config"]["testbed"]["hosts"][0])
    # the PE's prefills: its rank 0 sent its collectives' tensors to rank 1 (+ gloo's frames, TCP/IP)...
    assert pe["runtime_lc_bytes"] > MB and 1.0 <= pe["kernel_rank0_to_rank1_bytes"] / pe["runtime_lc_bytes"] <= 1.5
    assert pe["kernel_kv_class_bytes"] < 0.01 * pe["kernel_lc_class_bytes"]  # ... in the latency-critical class
