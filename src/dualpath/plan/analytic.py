"""What each resource of a configuration must do for a workload, from the cost model: the
planner's pruning and its name for the binding resource.

`demand` sums the workload once (shape-free: tokens, bytes, one GPU's attention seconds);
`estimate` turns it into busy seconds per resource for a shape and a mode:

- storage reads: every hit byte crosses one SNIC, the PE nodes' only (basic) or any node's
  (the modes with the DE read path), at `NodeSpec.snic_read_bytes_per_s`;
- prefill compute: one GPU's attention and linear seconds spread over the PE GPUs, plus the fixed
  cost of a forward (`ComputeModel.prefill_overhead_s`) once per compute quota of attention
  (docs/paper.md §3.5);
- decode compute: each generated token's attention over the DE GPUs, plus per step the fixed cost
  and the linear part at the batch the DE holds: its HBM's room for KV, or the agents per DE node
  if fewer (`DE HBM` names the first case when decode binds);
- the agent chain: an agent's turns run one after another, each at batch-one speed, with its tool
  time between them;
- arrivals: nothing ends before the last request arrives (online and trace workloads).

The estimate of the JCT is the largest of them; offline that one is `binding`, online the largest
resource's work (the agent chain and the arrivals aside): what saturates first as the load grows. They are
estimates, not bounds: forwards are not always full and reads do not always overlap compute; the
simulator confirms the survivors (search.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..config import ComputeKnobs, SchedulerConfig, paper_cluster
from ..sim.compute import ComputeModel
from .space import Shape, pd_range, reads_on_de


NOT_CAPACITY = ("arrivals", "agent chain")  # busy entries that are not a resource's work


@dataclass(frozen=True, slots=True)
class Demand:
    """A workload's totals (every turn of every agent). Per agent: arrays, one entry per agent."""

    num_agents: int
    num_turns: int
    hit_tokens: int
    miss_tokens: int
    gen_tokens: int
    prefill_attention_gpu_s: float  # one GPU's attention seconds, summed over every prompt
    decode_attention_gpu_s: float  # one GPU's attention seconds, summed over every generated token
    mean_decode_context_tokens: float  # context of a generated token, averaged over tokens
    agent_gen_tokens: np.ndarray
    agent_prefill_attention_s: np.ndarray
    agent_turns: np.ndarray
    agent_wait_s: np.ndarray  # tool time between the agent's rounds, in all
    last_arrival_s: float = 0.0  # the workload's last arrival (0 offline): no run ends before it


@dataclass(frozen=True, slots=True)
class Estimate:
    shape: Shape
    mode: str
    busy_s: dict[str, float]  # resource -> seconds of work at full rate
    jct_s: float  # the largest busy time: the JCT estimate
    binding: str  # offline: the largest busy time's; online: the largest resource work's (NOT_CAPACITY aside)
    out_of_range: str | None  # the resource the bottleneck-free range says binds first, or None


def demand(rows: Sequence[tuple[int, int, int, int, float]], model: str, last_arrival_s: float = 0.0) -> Demand:
    """Sum the workload's turns (agent, prompt, hit, generated tokens, tool time: plan/workload.py) on `model`:
    once per plan, for every shape."""
    compute = _compute(model, *_any_fitting_shape(model))
    num_agents = 1 + max(r[0] for r in rows)
    gen = np.zeros(num_agents)
    attn = np.zeros(num_agents)
    turns = np.zeros(num_agents)
    waits = np.zeros(num_agents)
    hit_total = miss_total = decode_attn = weighted_ctx = 0.0
    for agent, prompt, hit, gen_tokens, wait_s in rows:
        waits[agent] += wait_s
        ctx = prompt + gen_tokens / 2
        attn[agent] += compute.attention_time_s(hit, prompt - hit)
        seconds, kv_bytes = compute.decode_request_cost(ctx)
        decode_attn += gen_tokens * compute.gpu_attention_s(seconds, kv_bytes)
        weighted_ctx += gen_tokens * ctx
        hit_total += hit
        miss_total += prompt - hit
        gen[agent] += gen_tokens
        turns[agent] += 1
    return Demand(
        num_agents=int((turns > 0).sum()), num_turns=len(rows), hit_tokens=int(hit_total),
        miss_tokens=int(miss_total), gen_tokens=int(gen.sum()), prefill_attention_gpu_s=float(attn.sum()),
        decode_attention_gpu_s=decode_attn, mean_decode_context_tokens=weighted_ctx / max(1.0, gen.sum()),
        agent_gen_tokens=gen, agent_prefill_attention_s=attn, agent_turns=turns, agent_wait_s=waits,
        last_arrival_s=last_arrival_s,
    )


def estimate(d: Demand, model: str, shape: Shape, mode: str) -> Estimate:
    cluster = paper_cluster(model, shape.pd)
    spec, node = cluster.model_spec, cluster.node
    g, p, dn = node.gpus_per_node, shape.num_prefill_nodes, shape.num_decode_nodes
    compute = _compute(model, shape.unit_prefill_nodes, shape.unit_decode_nodes)  # weights over a unit's EP groups
    quota_s = SchedulerConfig().compute_quota_s
    busy: dict[str, float] = {}

    hit_bytes = d.hit_tokens * spec.kv_bytes_per_token
    if reads_on_de(mode):
        busy["PE+DE SNIC"] = hit_bytes / ((p + dn) * node.snic_read_bytes_per_s)
    else:
        busy["PE SNIC"] = hit_bytes / (p * node.snic_read_bytes_per_s)

    attn_per_gpu = d.prefill_attention_gpu_s / (p * g)
    linear_per_node = compute.prefill_forward_s(0.0, d.miss_tokens) - compute.prefill_overhead_s
    busy["compute (PE)"] = attn_per_gpu + linear_per_node / p + max(1.0, attn_per_gpu / quota_s) * compute.prefill_overhead_s

    kv_room = cluster.kv_hbm_bytes_per_gpu(shape.unit_decode_nodes) * g / (spec.kv_bytes_per_token * max(1.0, d.mean_decode_context_tokens))
    agents_per_node = d.num_agents / dn
    batch = max(1.0, min(kv_room, agents_per_node))
    steps = d.gen_tokens / dn / batch
    step_fixed_s = compute.decode_step_s(0.0, int(round(batch)))
    decode_busy = d.decode_attention_gpu_s / (dn * g) + steps * step_fixed_s
    busy["DE HBM" if kv_room < agents_per_node else "compute (DE)"] = decode_busy

    step_one_s = compute.decode_step_s(0.0, 1)
    chain = (d.agent_gen_tokens * step_one_s + d.agent_prefill_attention_s
             + d.agent_turns * compute.prefill_overhead_s + d.agent_wait_s)
    busy["agent chain"] = float(chain.max()) if len(chain) else 0.0
    if d.last_arrival_s > 0:
        busy["arrivals"] = d.last_arrival_s

    # Online, the arrivals set the pace and the chain is a latency floor: what binds is the resource
    # that saturates first as the load grows. Offline, whatever takes longest.
    work = {k: v for k, v in busy.items() if k not in NOT_CAPACITY} if d.last_arrival_s > 0 else busy
    binding = max(work, key=work.__getitem__)
    out = pd_range(node).violated(shape.ratio) if reads_on_de(mode) else None
    return Estimate(shape, mode, busy, max(busy.values()), out or binding, out)


def _any_fitting_shape(model: str) -> tuple[int, int]:
    """A shape whose weight shards fit: the demand's per-token costs do not depend on it (only the
    weight-read and fixed terms do, and `estimate` takes those per shape)."""
    from .space import min_nodes_per_role

    n = min_nodes_per_role(model)
    return n, n


def _compute(model: str, p: int, d: int) -> ComputeModel:
    cluster = paper_cluster(model, f"{p}P{d}D")
    g = cluster.node.gpus_per_node
    return ComputeModel(cluster.model_spec, cluster.gpu_spec, ComputeKnobs(), g,
                        cluster.weight_shards(p), cluster.weight_shards(d))
