"""The testbed's shape, pure: which namespaces, links, addresses and traffic classes a run needs.

Emulated hosts on one machine, so a run crosses real links without a cluster. Every host is a Linux network namespace:

    storage host  <-- SNIC link per node -->  node hosts (one per engine: p0.., d0..)
    node hosts    <-- CNIC link per node -->  fabric (a namespace holding one bridge, the switch)

A link is a veth pair. Its rate is set with `tc` HTB on the egress of both ends, so each direction
is capped, as a full-duplex NIC is. Each capped end carries two classes, and the packet's DSCP
picks one (transport/tcp.py marks them): EF (46) for the latency-critical lane and CS1 (8) for KV.
Unmarked traffic goes to the KV class.

How the qdisc stands for InfiniBand's VL arbitration (docs/paper.md §2.3). The paper gives the
high-priority VL ~99% of the weight in a weighted round robin, and the low VL takes what is left.
HTB does the same with two sibling classes. Their guaranteed `rate`s are the link rate split by
the lane weights (99:1, LaneWeights), so under contention each class gets its share. Both `ceil`s
are the link rate, so an idle class lends its share and the link stays work-conserving, as VL
arbitration does. Both classes sit at the same `prio`, with `quantum`s in the same 99:1 ratio, so
the bytes borrowed beyond the guarantees are split by weight too. Strict priority would starve
KV; the paper's arbitration does not.

Names: every interface and namespace starts with `dp<run id>`, at most 15 characters (IFNAMSIZ),
so two runs never collide and `down` finds everything a run made. Addresses come from 10.231.0.0/16
(private, RFC 1918), one /30 per SNIC link, and one /24 per run for the compute bridge, with the
run's index in the third octet.

Optionally (`mgmt=True`) a management network: a second bridge in the fabric namespace and one
unshaped veth per host (`mgmt0`, 10.233.<run>.<k + 1>/24), for a cluster manager's own traffic
(Ray's GCS, raylets, object transfers: deploy/ray/testbed.py), so it rides neither the
shaped SNIC/CNIC links nor their classes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ...core.lanes import Lane, LaneWeights
from ...errors import InputError

PREFIX = "dp"
IFNAMSIZ_CHARS = 15  # Linux interface names hold 15 characters (IFNAMSIZ 16, with the NUL)
RUN_ID_RE = re.compile(r"^[a-z0-9]{1,5}$")  # dp + 5 + "-p12s" = 12 characters at most
MAX_NODES_PER_ROLE = 8  # two digits of host name are never needed; bounds the /30 plan below
DSCP_BY_LANE = {Lane.LATENCY_CRITICAL: 46, Lane.KV: 8}  # transport/tcp.py's marks
HTB_QUANTUM_BYTES_PER_WEIGHT = 1514  # one Ethernet frame per unit of weight in the DRR round
CLASS_MINOR = {Lane.LATENCY_CRITICAL: 10, Lane.KV: 20}  # tc class ids 1:10 and 1:20


@dataclass(frozen=True, slots=True)
class Link:
    """A veth pair: `a_if` in namespace `a_ns`, `b_if` in `b_ns`; both ends capped at the rate."""

    name: str  # "snic" or "cnic"
    host: str  # the node host it belongs to
    a_ns: str
    a_if: str
    a_addr: str  # CIDR, "" when the end is a bridge port
    b_ns: str
    b_if: str
    b_addr: str
    rate_bytes_per_s: float
    shaped: bool = True  # HTB with the two lanes on both ends; False: the management network, unshaped


@dataclass(frozen=True, slots=True)
class TestbedPlan:
    run_id: str
    storage_ns: str
    fabric_ns: str
    bridge: str
    hosts: tuple[str, ...]  # node namespaces, prefill nodes first
    roles: tuple[str, ...]  # "prefill" / "decode", per host
    links: tuple[Link, ...]
    storage_addr_of: dict  # host namespace -> the storage host's address on that host's SNIC link
    cnic_addr_of: dict  # host namespace -> its address on the compute network
    weights: LaneWeights
    router_ns: str = ""  # a host for the router, linked to both networks like a node ("" = none)
    tp_hosts: tuple[str, ...] = ()  # hosts of engines' tensor-parallel rank 1, CNIC link only (tp_hosts.py)
    mgmt_bridge: str = ""  # the management network's bridge in the fabric namespace ("" = none)
    mgmt_addr_of: dict = field(default_factory=dict)  # host namespace -> its management address

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (self.storage_ns, self.fabric_ns, *self.hosts, *((self.router_ns,) if self.router_ns else ()),
                *self.tp_hosts)


def _check(run_id: str, num_prefill: int, num_decode: int, run_index: int) -> None:
    if not RUN_ID_RE.match(run_id):
        raise InputError(f"testbed id {run_id!r}: 1-5 lowercase letters or digits")
    if not (1 <= num_prefill <= MAX_NODES_PER_ROLE and 1 <= num_decode <= MAX_NODES_PER_ROLE):
        raise InputError(f"testbed: 1-{MAX_NODES_PER_ROLE} prefill and decode nodes, got {num_prefill}P{num_decode}D")
    if not 0 <= run_index <= 255:
        raise InputError(f"testbed run index {run_index} outside 0-255")


def plan_testbed(run_id: str, num_prefill: int, num_decode: int, snic_bytes_per_s: float, cnic_bytes_per_s: float,
                 run_index: int = 0, weights: LaneWeights = LaneWeights(), router: bool = False,
                 mgmt: bool = False) -> TestbedPlan:
    """The namespaces, links and addresses of one run; `run_index` picks its address block.
    `router`: one more host, `<base>-r`, for the router: an SNIC link to the storage host (its
    lookups) and a CNIC port on the fabric (its control messages), both at the CNIC rate (the
    router's links are no bottleneck in the paper's cluster). `mgmt`: the management network
    (module docstring), a port on it for every host."""
    _check(run_id, num_prefill, num_decode, run_index)
    if snic_bytes_per_s <= 0 or cnic_bytes_per_s <= 0:
        raise InputError("testbed link rates must be positive")
    base = f"{PREFIX}{run_id}"
    storage_ns, fabric_ns, bridge = f"{base}-st", f"{base}-fab", f"{base}-br"
    hosts = tuple(f"{base}-p{i}" for i in range(num_prefill)) + tuple(f"{base}-d{i}" for i in range(num_decode))
    roles = ("prefill",) * num_prefill + ("decode",) * num_decode
    links: list[Link] = []
    storage_addr_of, cnic_addr_of = {}, {}
    router_ns = f"{base}-r" if router else ""
    every = hosts + ((router_ns,) if router else ())
    for k, host in enumerate(every):
        short = host[len(base) + 1:]  # p0, d1, ..., r
        rate = cnic_bytes_per_s if host == router_ns else snic_bytes_per_s
        # SNIC: 10.231.<run>.<4k + 1, 4k + 2>/30 (storage end, node end); CNIC: 10.232.<run>.<k + 1>/24
        st_ip, node_ip = f"10.231.{run_index}.{4 * k + 1}", f"10.231.{run_index}.{4 * k + 2}"
        links.append(Link("snic", host, storage_ns, f"{base}-{short}s", f"{st_ip}/30", host, "snic0", f"{node_ip}/30", rate))
        cnic_ip = f"10.232.{run_index}.{k + 1}"
        links.append(Link("cnic", host, fabric_ns, f"{base}-{short}c", "", host, "cnic0", f"{cnic_ip}/24",
                          cnic_bytes_per_s))
        storage_addr_of[host], cnic_addr_of[host] = st_ip, cnic_ip
    mgmt_addr_of = {}
    for k, host in enumerate(every if mgmt else ()):
        mgmt_addr_of[host] = f"10.233.{run_index}.{k + 1}"
        links.append(Link("mgmt", host, fabric_ns, f"{base}-{host[len(base) + 1:]}m", "", host, "mgmt0",
                          f"{mgmt_addr_of[host]}/24", 0.0, shaped=False))
    for link in links:
        for name in (link.a_if, link.b_if):
            assert len(name) <= IFNAMSIZ_CHARS, name
    return TestbedPlan(run_id, storage_ns, fabric_ns, bridge, hosts, roles, tuple(links), storage_addr_of, cnic_addr_of,
                       weights, router_ns, mgmt_bridge=f"{base}-mb" if mgmt else "", mgmt_addr_of=mgmt_addr_of)


def _bits(bytes_per_s: float) -> str:
    return f"{max(8, int(bytes_per_s * 8))}bit"


def shape_commands(ns: str, dev: str, rate_bytes_per_s: float, weights: LaneWeights) -> list[list[str]]:
    """HTB on `dev`'s egress: a root class at the link rate, the two lanes under it (module doc)."""
    total = weights.latency_critical + weights.kv
    tc = ["ip", "netns", "exec", ns, "tc"]
    cmds = [tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", str(CLASS_MINOR[Lane.KV])],
            tc + ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb", "rate", _bits(rate_bytes_per_s),
                  "ceil", _bits(rate_bytes_per_s)]]
    for lane in (Lane.LATENCY_CRITICAL, Lane.KV):
        w = weights.weight(lane)
        cmds.append(tc + ["class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{CLASS_MINOR[lane]}", "htb",
                          "rate", _bits(rate_bytes_per_s * w / total), "ceil", _bits(rate_bytes_per_s), "prio", "0",
                          "quantum", str(max(HTB_QUANTUM_BYTES_PER_WEIGHT, int(w * HTB_QUANTUM_BYTES_PER_WEIGHT)))])
    cmds.append(tc + ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
                      "dsfield", f"{DSCP_BY_LANE[Lane.LATENCY_CRITICAL] << 2:#04x}", "0xfc",
                      "flowid", f"1:{CLASS_MINOR[Lane.LATENCY_CRITICAL]}"])
    return cmds


def up_commands(plan: TestbedPlan) -> list[list[str]]:
    """Every `ip` / `tc` command `up` runs, in order (`down` deletes the namespaces, which takes
    every veth end and qdisc inside with it)."""
    cmds: list[list[str]] = [["ip", "netns", "add", ns] for ns in plan.namespaces]
    cmds += [["ip", "-n", ns, "link", "set", "lo", "up"] for ns in plan.namespaces]
    fab = plan.fabric_ns
    for br in (plan.bridge, *((plan.mgmt_bridge,) if plan.mgmt_bridge else ())):
        cmds += [["ip", "-n", fab, "link", "add", br, "type", "bridge"], ["ip", "-n", fab, "link", "set", br, "up"]]
    for link in plan.links:
        # created inside the node's namespace, so no name ever appears in the root namespace
        cmds.append(["ip", "-n", link.b_ns, "link", "add", link.b_if, "type", "veth", "peer", "name", link.a_if,
                     "netns", link.a_ns])
        for ns, dev, addr in ((link.a_ns, link.a_if, link.a_addr), (link.b_ns, link.b_if, link.b_addr)):
            if addr:
                cmds.append(["ip", "-n", ns, "addr", "add", addr, "dev", dev])
            cmds.append(["ip", "-n", ns, "link", "set", dev, "up"])
            if link.shaped:
                cmds += shape_commands(ns, dev, link.rate_bytes_per_s, plan.weights)
        if not link.a_addr:
            bridge = plan.mgmt_bridge if link.name == "mgmt" else plan.bridge
            cmds.append(["ip", "-n", fab, "link", "set", link.a_if, "master", bridge])
    return cmds


def down_commands(plan_namespaces: tuple[str, ...]) -> list[list[str]]:
    return [["ip", "netns", "del", ns] for ns in plan_namespaces]
