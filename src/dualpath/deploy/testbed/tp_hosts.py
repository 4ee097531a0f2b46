"""Tensor-parallel ranks on the testbed: rank 1 of an engine on an emulated host of its own, and
its collectives in the latency-critical class, marked by the kernel.

1. `with_tp_hosts(plan, engines)`: for each engine host `<base>-d0`, a host `<base>-d0t` with one
   CNIC link to the fabric at the plan's CNIC rate (no SNIC: rank 1 has no KV and no store), at
   10.232.<run>.<101 + i>. Rank 0 <-> rank 1 traffic then crosses rank 0's CNIC link, which its
   KV (DE -> PE layer streams, PD transfers) also crosses.
2. `tp_filter_commands`: gloo opens its own sockets, so the DSCP marks of transport/tcp.py cannot
   be set on them from Python (and iptables' DSCP target is not installed here). Instead, on every
   capped CNIC end the pair's packets cross, u32 filters match the rank pair's addresses (both
   directions) and steer them to the latency-critical class 1:10, beside the plan's DSCP filter
   (same parent, prio 2). Everything else keeps its DSCP class; unmarked traffic stays in 1:20.
3. `gso_commands`: the kernel hands a qdisc TCP segments of up to 64 KiB (GSO), which HTB sends
   whole: at tens of MB/s one KV segment holds a link for milliseconds, and a latency-critical
   message behind it waits that long, where a fabric arbitrates its VLs per packet (IB MTU 4 KiB,
   docs/paper.md §2.3). Capping GSO makes the emulated links arbitrate smaller units, at the price of
   the kernel handling more packets (CPU the emulation takes from the engines on a small machine).
4. `rate_commands`: the links' classes re-rated in place (`tc class change`), for a bench that
   derives its rate from a measurement on the running testbed.
"""

from __future__ import annotations

from dataclasses import replace

from ...core.lanes import Lane
from .plan import CLASS_MINOR, HTB_QUANTUM_BYTES_PER_WEIGHT, Link, TestbedPlan, _bits

TP_OCTET_BASE = 101  # 10.232.<run>.<101 + i>: above every node and router address (plan.py: k + 1 <= 17)
TP_FILTER_PRIO = 2  # after the plan's DSCP filter (prio 1); both steer to 1:10, so order does not matter


def tp_host_of(engine_host: str) -> str:
    return f"{engine_host}t"


def with_tp_hosts(plan: TestbedPlan, engine_hosts: tuple[str, ...]) -> TestbedPlan:
    """The plan plus a rank-1 host per engine host (module doc, 1)."""
    base = plan.storage_ns.removesuffix("-st")
    run_index = plan.cnic_addr_of[plan.hosts[0]].split(".")[2]
    cnic_rate = next(link.rate_bytes_per_s for link in plan.links if link.name == "cnic")
    links, addrs = list(plan.links), dict(plan.cnic_addr_of)
    for i, host in enumerate(engine_hosts):
        if host not in plan.hosts:
            raise ValueError(f"{host} is not a host of testbed {plan.run_id}")
        tp_ns = tp_host_of(host)
        addr = f"10.232.{run_index}.{TP_OCTET_BASE + i}"
        links.append(Link("cnic", tp_ns, plan.fabric_ns, f"{base}-{tp_ns[len(base) + 1:]}c", "", tp_ns, "cnic0",
                          f"{addr}/24", cnic_rate))
        addrs[tp_ns] = addr
    return replace(plan, links=tuple(links), cnic_addr_of=addrs,
                   tp_hosts=plan.tp_hosts + tuple(tp_host_of(h) for h in engine_hosts))


def cnic_ends(plan: TestbedPlan, host: str) -> list[tuple[str, str]]:
    """(namespace, device) of both ends of `host`'s CNIC link: its own egress and the fabric's."""
    link = next(x for x in plan.links if x.name == "cnic" and x.host == host)
    return [(link.b_ns, link.b_if), (link.a_ns, link.a_if)]


def tp_filter_commands(plan: TestbedPlan, engine_host: str) -> list[list[str]]:
    """u32 filters that put the engine's rank pair into class 1:10 on all four CNIC ends they cross."""
    a, b = plan.cnic_addr_of[engine_host], plan.cnic_addr_of[tp_host_of(engine_host)]
    flow = f"1:{CLASS_MINOR[Lane.LATENCY_CRITICAL]}"
    cmds = []
    for ns, dev in cnic_ends(plan, engine_host) + cnic_ends(plan, tp_host_of(engine_host)):
        for src, dst in ((a, b), (b, a)):
            cmds.append(["ip", "netns", "exec", ns, "tc", "filter", "add", "dev", dev, "parent", "1:", "protocol", "ip",
                         "prio", str(TP_FILTER_PRIO), "u32", "match", "ip", "src", f"{src}/32", "match", "ip", "dst",
                         f"{dst}/32", "flowid", flow])
    return cmds


def gso_commands(plan: TestbedPlan, gso_max_bytes: int) -> list[list[str]]:
    """GSO capped at `gso_max_bytes` on every end of every link (module doc, 3)."""
    return [["ip", "-n", ns, "link", "set", "dev", dev, "gso_max_size", str(gso_max_bytes)]
            for link in plan.links for ns, dev in ((link.a_ns, link.a_if), (link.b_ns, link.b_if))]


def rate_commands(plan: TestbedPlan, rate_bytes_per_s: float, names: tuple[str, ...] = ("cnic",)) -> list[list[str]]:
    """`tc class change` of every end of the links named `names` (cnic, snic) to `rate_bytes_per_s`,
    lanes split as plan.py splits them."""
    total = plan.weights.latency_critical + plan.weights.kv
    cmds = []
    for link in plan.links:
        if link.name not in names:
            continue
        for ns, dev in ((link.a_ns, link.a_if), (link.b_ns, link.b_if)):
            tc = ["ip", "netns", "exec", ns, "tc", "class", "change", "dev", dev]
            cmds.append(tc + ["parent", "1:", "classid", "1:1", "htb", "rate", _bits(rate_bytes_per_s),
                              "ceil", _bits(rate_bytes_per_s)])
            for lane in (Lane.LATENCY_CRITICAL, Lane.KV):
                share = rate_bytes_per_s * plan.weights.weight(lane) / total
                w = plan.weights.weight(lane)
                cmds.append(tc + ["parent", "1:1", "classid", f"1:{CLASS_MINOR[lane]}", "htb", "rate", _bits(share),
                                  "ceil", _bits(rate_bytes_per_s), "prio", "0", "quantum",
                                  str(max(HTB_QUANTUM_BYTES_PER_WEIGHT, int(w * HTB_QUANTUM_BYTES_PER_WEIGHT)))])
    return cmds
