"""The configurations a GPU budget allows, and the unit each one is simulated at.

A configuration is P prefill nodes, D decode nodes (a node: `NodeSpec.gpus_per_node` GPUs) and a
loading policy (a `--mode`). The planner spends the whole budget: P + D = budget / GPUs per node,
each role on at least as many nodes as its weights need (`ClusterConfig.kv_hbm_bytes_per_gpu`).

Unit scale: the paper runs 48P96D with 24x the agents of 2P4D and gets the same JCT (docs/paper.md
§6.7, Table 3): what a node sees depends on the P:D ratio and the agents per node, not on the
cluster's size, as long as its expert-parallel groups stay the same size (a group's span sets how
much of each token's EP traffic crosses the CNICs and how many shards its weights take). So kP x kD
with kN agents is deployed as k units, each role of each unit one EP group (`Shape.ep_knobs`), and
simulated as one unit, P x D with N agents, for the largest k that divides P, D and the agents and
leaves each role room for its weights. `dualpath bench plan` measures the error against the whole
deployment simulated (docs/results.md).

The bottleneck-free range of docs/paper.md §1.6 bounds P/D for the modes that read through the
decode engines: outside it a CNIC or the DE's DRAM binds before the storage NICs do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence
from math import gcd

from ..config import paper_cluster
from ..costmodel.hardware import GB, NodeSpec
from ..errors import InputError

# docs/paper.md §1.6: a node's memory bandwidth M ≈ 500 GB/s in the paper's bottleneck-free analysis.
NODE_DRAM_BYTES_PER_S = 500 * GB
# The loading policies a deployment can run (oracle is a bound, not a policy).
DEFAULT_MODES = ("basic", "dualpath", "dualpath+split", "dualpath+tail")


def configurations(shape_list: Sequence["Shape"], modes: Sequence[str]) -> list[tuple["Shape", str]]:
    """Every (shape, mode) the planner weighs, each mode as the shape deploys it: a shape of several
    units runs its mode with `+tail` (core/policy/tail.py), so that the one scheduler spreads the
    offline start burst over the units' PE groups as separate units would, and a unit's simulation
    predicts the whole (tests/sim/test_start_burst.py); `X` and `X+tail` are then one configuration."""
    from ..config.features import TAIL_SUFFIX

    out: list[tuple[Shape, str]] = []
    for s in shape_list:
        for m in modes:
            deployed = m + TAIL_SUFFIX if s.copies > 1 and not m.endswith(TAIL_SUFFIX) else m
            if (s, deployed) not in out:
                out.append((s, deployed))
    return out


def unit_mode(shape: "Shape", mode: str) -> str:
    """The mode a shape's unit simulation runs: `X+tail` on a unit of one PE group is `X`
    (core/policy/tail.py changes nothing with one group open), so the two share one simulation."""
    from ..config.features import TAIL_SUFFIX

    if mode.endswith(TAIL_SUFFIX) and shape.unit_prefill_nodes == 1:
        return mode.removesuffix(TAIL_SUFFIX)
    return mode


def reads_on_de(mode: str) -> bool:
    """Whether a mode reads hits through the decode engines too (its features' DE read path)."""
    from ..config import parse_mode

    return parse_mode(mode).de_read_path


@dataclass(frozen=True, slots=True)
class Shape:
    """P prefill and D decode nodes; `unit` is the shape it is simulated at, `copies` = P / unit P."""

    num_prefill_nodes: int
    num_decode_nodes: int
    unit_prefill_nodes: int
    unit_decode_nodes: int

    @property
    def pd(self) -> str:
        return f"{self.num_prefill_nodes}P{self.num_decode_nodes}D"

    @property
    def unit_pd(self) -> str:
        return f"{self.unit_prefill_nodes}P{self.unit_decode_nodes}D"

    @property
    def copies(self) -> int:
        return self.num_prefill_nodes // self.unit_prefill_nodes

    @property
    def ratio(self) -> float:
        return self.num_prefill_nodes / self.num_decode_nodes

    def ep_knobs(self) -> tuple[str, ...]:
        """`--set` assignments that deploy the shape as `copies` units, each role of each unit one
        expert-parallel group (ClusterConfig.ep_group_*_nodes); () for a shape that is its own unit."""
        if self.copies == 1:
            return ()
        return (f"cluster.ep_group_prefill_nodes={self.unit_prefill_nodes}",
                f"cluster.ep_group_decode_nodes={self.unit_decode_nodes}")


@dataclass(frozen=True, slots=True)
class PdRange:
    """docs/paper.md §1.6: s/(g-s) <= P/D <= min((g-2s)/s, (g-s)/(2s), (M/(Bs)-3)/2)."""

    low: float
    high_cnic_read: float
    high_cnic_write: float
    high_dram: float

    @property
    def high(self) -> float:
        return min(self.high_cnic_read, self.high_cnic_write, self.high_dram)

    def violated(self, ratio: float) -> str | None:
        """The resource that binds first outside the range (None inside it)."""
        if ratio < self.low:
            return "PE CNIC"  # its write side: every DE-path layer stream lands there
        bounds = sorted([(min(self.high_cnic_read, self.high_cnic_write), "DE CNIC"), (self.high_dram, "DE DRAM")],
                        key=lambda b: b[0])
        return next((name for high, name in bounds if ratio > high), None)


def pd_range(node: NodeSpec, node_dram_bytes_per_s: float = NODE_DRAM_BYTES_PER_S) -> PdRange:
    g = node.gpus_per_node
    s = node.snic_bytes_per_s / node.cnic_bytes_per_s  # a node's SNIC in units of one CNIC (B)
    inf = float("inf")
    return PdRange(
        low=s / (g - s) if g > s else inf,
        high_cnic_read=(g - 2 * s) / s,
        high_cnic_write=(g - s) / (2 * s),
        high_dram=(node_dram_bytes_per_s / node.snic_bytes_per_s - 3) / 2,
    )


def min_nodes_per_role(model: str) -> int:
    """The fewest nodes a role needs to hold the model's weights (expert-parallel shards)."""
    cluster = paper_cluster(model)
    for n in range(1, 65):
        try:
            cluster.kv_hbm_bytes_per_gpu(n)
            return n
        except InputError:
            continue
    raise InputError(f"{model} does not fit on 64 nodes of {cluster.gpu}")


def shapes(model: str, gpus: int, num_agents: int) -> list[Shape]:
    """Every P x D that spends `gpus` (P + D = nodes), P ascending, each with its unit."""
    g = paper_cluster(model).node.gpus_per_node
    if gpus <= 0 or gpus % g:
        raise InputError(f"--gpus must be a positive multiple of {g} (GPUs per node), got {gpus}")
    nodes = gpus // g
    least = min_nodes_per_role(model)
    if nodes < 2 * least:
        raise InputError(f"{model} needs at least {least} node(s) per role: {2 * least * g} GPUs, got {gpus}")
    return [_with_unit(p, nodes - p, num_agents, least) for p in range(least, nodes - least + 1)]


def _with_unit(p: int, d: int, num_agents: int, least: int) -> Shape:
    common = gcd(gcd(p, d), num_agents)
    for k in sorted((k for k in range(1, common + 1) if common % k == 0), reverse=True):
        if p // k >= least and d // k >= least:
            return Shape(p, d, p // k, d // k)
    return Shape(p, d, p, d)
