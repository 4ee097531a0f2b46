"""The testbed (deploy/testbed/plan.py, netns.py): its plan (pure), and, as root, links whose rate and lane classes the
kernel enforces, and a `down` (also after a failed `up`) that leaves nothing behind."""

from __future__ import annotations

import os

import pytest

from dualpath.errors import InputError
from dualpath.deploy.testbed.plan import IFNAMSIZ_CHARS, plan_testbed, up_commands

MB = 1e6


def test_the_plan_names_fit_and_never_collide_across_runs():
    a, b = plan_testbed("a1", 2, 3, 4 * MB, 32 * MB), plan_testbed("b2", 2, 3, 4 * MB, 32 * MB, run_index=1)
    assert a.roles == ("prefill",) * 2 + ("decode",) * 3 and len(a.links) == 10
    ends = [(link.a_ns, link.a_if) for link in a.links] + [(link.b_ns, link.b_if) for link in a.links]
    assert len(set(ends)) == len(ends) and all(len(dev) <= IFNAMSIZ_CHARS for _, dev in ends)
    assert not set(a.namespaces) & set(b.namespaces) and all(ns.startswith("dpa1-") for ns in a.namespaces)
    addrs = [link.a_addr for link in a.links + b.links if link.a_addr] + [link.b_addr for link in a.links + b.links]
    assert len(set(addrs)) == len(addrs)
    # every capped end: HTB with the link rate, lanes at 99:1 of it, each allowed the whole link
    cmds = [" ".join(c) for c in up_commands(a)]
    assert sum("classid 1:10 htb rate 253440000bit ceil 256000000bit" in c for c in cmds) == 2 * 5  # 5 CNICs, both ends
    assert sum("classid 1:20 htb rate 320000bit ceil 32000000bit" in c for c in cmds) == 2 * 5  # 5 SNICs, both ends
    assert sum("dsfield 0xb8 0xfc flowid 1:10" in c for c in cmds) == 4 * 5  # EF -> the latency-critical class
    for bad in (("A1", 1, 1), ("toolong", 1, 1), ("ok", 0, 1), ("ok", 1, 9)):
        with pytest.raises(InputError):
            plan_testbed(*bad, 4 * MB, 32 * MB)


def _root_ns_holds_none_of(plan) -> None:
    """No link of the run (its names carry the run's prefix), and so no qdisc on one, is left in the root namespace."""
    from dualpath.deploy.testbed.netns import run_command

    prefix = f"dp{plan.run_id}-"
    links = [line.split(":")[1].strip() for line in run_command(["ip", "-o", "link", "show"]).stdout.splitlines()]
    qdiscs = [line for line in run_command(["tc", "qdisc", "show"]).stdout.splitlines() if f" dev {prefix}" in line]
    assert not [n for n in links if n.startswith(prefix)] and not qdiscs, (links, qdiscs)


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALPATH_TESTBED_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


@pytest.mark.testbed_root
def test_the_kernel_caps_each_link_and_classifies_the_lanes_and_down_leaves_nothing(state_dir):
    from dualpath.deploy.testbed.netns import class_bytes, down, interface_bytes, namespaces_with_prefix, up
    from dualpath.deploy.testbed.probe import transfer

    plan = plan_testbed(f"t{os.getpid() % 10000}", 1, 1, 4 * MB, 32 * MB, run_index=250)
    up(plan)
    try:
        assert namespaces_with_prefix(f"dp{plan.run_id}-") == sorted(plan.namespaces)
        st, p0 = plan.storage_ns, plan.hosts[0]
        snic = next(link for link in plan.links if link.name == "snic" and link.host == p0)
        node_ip = snic.b_addr.split("/")[0]
        tx0 = interface_bytes(st, snic.a_if)[0]
        kv = transfer(st, p0, node_ip, 2_000_000, dscp=8)  # a storage read: storage -> node, 0.5 s at 4 MB/s
        assert kv.payload_bytes == 2_000_000
        assert 0.75 * 4 * MB < kv.bytes_per_s < 1.05 * 4 * MB, kv  # the HTB cap, less TCP/IP headers
        wire = interface_bytes(st, snic.a_if)[0] - tx0
        assert 1.0 < wire / kv.payload_bytes < 1.06  # headers: ~3% at a 1,500-byte MTU (52 of 1,500)
        before = class_bytes(st, snic.a_if)
        lc = transfer(st, p0, node_ip, 500_000, dscp=46)
        after = class_bytes(st, snic.a_if)
        assert after[10] - before[10] >= lc.payload_bytes  # EF went to the latency-critical class
        assert after[20] - before[20] < 0.1 * lc.payload_bytes  # ... not to KV (only its ACK-less control)
    finally:
        removed = down(plan.run_id)
    assert sorted(removed) == sorted(plan.namespaces)
    assert namespaces_with_prefix(f"dp{plan.run_id}-") == [] and not (state_dir / f"{plan.run_id}.json").exists()
    _root_ns_holds_none_of(plan)


@pytest.mark.testbed_root
def test_a_failed_up_is_rolled_back(state_dir):
    from dualpath.deploy.testbed.netns import namespaces_with_prefix, up

    plan = plan_testbed(f"f{os.getpid() % 10000}", 1, 1, 4 * MB, 32 * MB, run_index=251)
    broken = up_commands(plan)[:12] + [["ip", "-n", plan.hosts[0], "link", "add", "x", "type", "no-such-kind"]]
    with pytest.raises(InputError, match="no-such-kind"):
        up(plan, broken)
    assert namespaces_with_prefix(f"dp{plan.run_id}-") == [] and not (state_dir / f"{plan.run_id}.json").exists()
    _root_ns_holds_none_of(plan)


@pytest.mark.parametrize("args,needle", [
    (["down"], "exactly one of --id ID and --all"),
    (["up", "--pd", "1P9D"], "1-8 prefill and decode nodes"),
    (["up", "--id", "Bad!"], "1-5 lowercase letters or digits"),
    (["up", "--snic-mb-s", "0"], "rates must be positive"),
])
def test_bad_testbed_input_is_one_line_and_exit_2(args, needle, state_dir):
    from cli_helpers import cli_here

    p = cli_here("testbed", *args)
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_without_root_the_testbed_says_so(monkeypatch, state_dir):
    from cli_helpers import cli_here

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    p = cli_here("testbed", "up", "--id", "nr1")
    assert p.returncode == 2 and "needs root" in p.stderr
