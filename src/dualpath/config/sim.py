"""The simulator's config sections: the cluster (nodes, NICs, the runtime-likeness flags of the
`local` preset), the compute knobs, the workload, the metrics, and `SimConfig` over them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from ..core.measured import MeasuredMachine
from ..costmodel.hardware import GB, GPUS, GpuSpec, NodeSpec
from ..costmodel.models import ModelSpec, get_model
from ..errors import InputError
from ..parsing import parse_pd
from .scheduler import SchedulerConfig


@dataclass(frozen=True, slots=True)
class ComputeKnobs:
    # System-level prefill MFU on the linear (GEMM) part, FP8 dense peak: DeepSeek's H800 fleet
    # computed 32.2k tokens/s per node at 71.4 GFLOP per token = 14.5% of FP8 dense, a 24-hour
    # average and thus a lower bound (docs/hardware.md §1.3, [S-D6]).
    prefill_mfu: float = 0.145
    # Attention kernels run BF16 math: FlashMLA sparse prefill 640 TFLOPS on H800 = 65% of 989
    # (docs/hardware.md §1.2, [S-FMLA]).
    attn_efficiency: float = 0.65
    # Fixed cost of every layer of a forward (prefill) or step (decode): expert-parallel dispatch
    # + combine latency. DeepEP low-latency kernels at EP32: ~120 + 170 us (docs/hardware.md §1.2,
    # [S-DEP]: 77-194 us and 114-369 us from EP8 to EP256) -> 0.29 ms per layer.
    ep_latency_per_layer_s: float = 0.29e-3
    # fitted (Fig. 3 right; hardware-only: compute.prefill_forward_overhead_s=0): extra fixed cost
    # per prefill forward, s. None: from docs/paper.md §4.1 Fig. 3 right [F] (one engine's throughput x2.6 /
    # x2.9 / x3.0 at 5 / 10 / 20 requests of 30K context + 300 new tokens over 1 fits t(b) = t0 + b * t1
    # with t0 = 2.5 * t1): 0.267 s for DS 660B; 0 leaves the EP term alone (61 x 0.29 ms = 17.7 ms).
    prefill_forward_overhead_s: float | None = None
    fig3_overhead_per_request_ratio: float = 2.5
    # FlashMLA memory-bound decode reaches 3,000 of 3,350 GB/s = 0.9 (docs/hardware.md §1.2, [S-FMLA]).
    decode_hbm_efficiency: float = 0.9
    # Decode GEMMs: DeepSeek's decode fleet ran at 14.6% of FP8 dense (docs/hardware.md §1.3, [S-D6]).
    decode_mfu: float = 0.146

    def __post_init__(self) -> None:
        for name in ("prefill_mfu", "attn_efficiency", "decode_hbm_efficiency", "decode_mfu"):
            v = getattr(self, name)
            if not 0 < v <= 1:
                raise InputError(f"{name} must be in (0, 1], got {v}")
        if self.ep_latency_per_layer_s < 0:
            raise InputError("ep_latency_per_layer_s must be >= 0")


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    model: str = "ds-v3.2-660b"
    gpu: str = "h800"
    num_prefill_nodes: int = 2
    num_decode_nodes: int = 4
    node: NodeSpec = field(default_factory=NodeSpec)
    block_tokens: int = 64  # docs/paper.md §1.5
    # choice: aggregate storage-cluster egress; None = unlimited. 3FS total bandwidth of the testbed is
    # not published (docs/paper.md §5); 3FS "can saturate 400 Gbps per SNIC".
    storage_egress_bytes_per_s: float | None = None
    # choice: reads a node's storage client runs at once (sharing its SNIC); 1 = strict FIFO.
    reads_in_flight_per_node: int = 1
    # choice: fraction of HBM usable for weights + KV; the rest is activations and workspace
    # (vLLM's default gpu_memory_utilization = 0.9).
    hbm_usable_fraction: float = 0.9
    # Weights are sharded across all GPUs of a role by expert parallelism (EP + DP attention for
    # the DeepSeek models, docs/paper.md §5); False = every GPU holds a full copy (Qwen 32B: DP only).
    expert_parallel: bool = True
    # EP dispatch/combine between nodes rides each GPU's CNIC on the latency-critical lane
    # (docs/paper.md §2.3; bytes from the model shape, DeepEP's kernels [S-DEP], costmodel/ep_traffic.py;
    # timing sim/ep_comm.py) in the MoE presets; False: only the fixed
    # ComputeKnobs.ep_latency_per_layer_s, no bytes on the CNIC (`dualpath bench lanes --sim` runs both;
    # docs/results/sim/lanes_ep.json).
    ep_over_cnic: bool = True
    # Ablations of the lanes (`dualpath bench lanes --sim`), settings rather than calibration:
    # every CNIC direction carries a KV flow that never ends (the KV class saturated); and the
    # counterfactual where EP bursts see an empty link whatever the KV does (the time "without KV
    # traffic", the same schedule otherwise).
    cnic_kv_flood: bool = False
    ep_ignores_kv: bool = False
    # The `local` preset's CNICs as the runtime's (so `dualpath fidelity` scores one mechanism): each
    # engine has one link for both directions, serving each lane FIFO (runtime/transport/arbiter.py: LinkArbiter), and every
    # copy is paced by the engine that makes it (a DE-path layer stream by the DE, a PD transfer
    # by the PE, a persisted block's D2H by the DE). False: full-duplex NICs shared by processor
    # sharing, as RDMA queue pairs share a real NIC.
    cnic_as_runtime_arbiter: bool = False
    # The `local` preset's decode engine as the runtime's (`dualpath fidelity`; sim/decode.py):
    # while a step runs, a request whose prompt KV has landed starts its H2D when the step ends (the
    # runtime's DE handles `PromptReady` between steps), and joins the batch when the step after its
    # H2D ends (engine/mid_step.py). False: both at once (the fluid decode of the paper presets).
    decode_waits_for_step_end: bool = False
    # The `local` preset's persists as the runtime's (`dualpath fidelity`; sim/persists.py): a DE's blocks
    # reach storage one at a time through its node's SNIC write bucket (the runtime's writer
    # thread, EngineBase._write_loop), and placement waits for a hit block still being written, at
    # most `persist_wait_s` (RuntimeConfig.store.persist_wait_s; router.py: Router._try_place); and a
    # turn's last token has no KV until the next turn (sim/hits.py: last_token_next_turn). False:
    # a queued block counts as written at once (the paper presets: a write is ~1% of the SNIC).
    persist_waits_for_snic_write: bool = False
    persist_wait_s: float = 10.0  # RuntimeConfig.store.persist_wait_s's default; used with the flag above
    # The `local` preset's host buffers as the router holds them (`dualpath fidelity`; sim/persists.py;
    # Placement.allocate_regions): placement takes a Full Block slot per prompt block in the DE's
    # buffer (PE path: the PE's too) or holds its FIFO. False: reserved at first use, docs/paper.md §1.3.
    buffers_at_placement: bool = False
    # choice: seconds before a read's first byte arrives (a store's request latency); 0 = none, as
    # the paper's model of 3FS reads at line rate. A knob for a slow or stalled store.
    storage_read_latency_s: float = 0.0
    # choice: the PE nodes' SNIC read rate as a fraction of NodeSpec's, an unbalanced cluster (split
    # reads' test bed, core/policy/split.py); 1 = the paper's cluster, every node's SNIC alike (§1.2).
    prefill_snic_scale: float = 1.0
    # choice: nodes per expert-parallel group of each role; None = one group spanning the role (the
    # paper's 2P4D, docs/paper.md §5 [I]). A group shards the weights (HBM left for KV, the weight read
    # of a step) and sets which share of a token's EP traffic leaves the node over the CNIC
    # (costmodel/ep_traffic.py). `dualpath plan` deploys kP x kD as k units, each its own EP groups.
    ep_group_prefill_nodes: int | None = None
    ep_group_decode_nodes: int | None = None
    # choice: `+dram` (core/dram.py), host DRAM per node kept for Full Blocks, beside the buffers
    # (NodeSpec's); the paper's SGL(MC) baseline ran with 1.5 TB per node (docs/paper.md §5). The
    # default is a point of the capacity sweep (`dualpath repro --only dram`, docs/results/beyond/dram.json).
    dram_tier_gb_per_node: float = 256.0

    def __post_init__(self) -> None:
        if self.dram_tier_gb_per_node < 0:
            raise InputError(f"dram_tier_gb_per_node must be >= 0, got {self.dram_tier_gb_per_node}")
        if self.storage_read_latency_s < 0:
            raise InputError(f"storage_read_latency_s must be >= 0, got {self.storage_read_latency_s}")
        if not 0 < self.prefill_snic_scale <= 1:
            raise InputError(f"prefill_snic_scale must be in (0, 1], got {self.prefill_snic_scale}")
        for name in ("ep_group_prefill_nodes", "ep_group_decode_nodes"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise InputError(f"{name} must be a positive number of nodes or None, got {v!r}")
        try:
            get_model(self.model)
        except KeyError as e:
            raise InputError(str(e.args[0])) from None
        if self.gpu not in GPUS:
            raise InputError(f"unknown GPU {self.gpu!r}; choose one of: {', '.join(sorted(GPUS))}")
        if self.num_prefill_nodes <= 0 or self.num_decode_nodes <= 0:
            raise InputError("need at least one prefill and one decode node")
        if self.block_tokens <= 0 or self.reads_in_flight_per_node <= 0:
            raise InputError("block_tokens and reads_in_flight_per_node must be positive")
        if not 0 < self.hbm_usable_fraction <= 1:
            raise InputError("hbm_usable_fraction must be in (0, 1]")

    @property
    def model_spec(self) -> ModelSpec:
        return get_model(self.model)

    @property
    def gpu_spec(self) -> GpuSpec:
        return GPUS[self.gpu]

    @property
    def pd(self) -> str:
        return f"{self.num_prefill_nodes}P{self.num_decode_nodes}D"

    @property
    def prefill_ep_nodes(self) -> int:
        """Nodes in one prefill EP group: the group size, at most the role's nodes."""
        return min(self.num_prefill_nodes, self.ep_group_prefill_nodes or self.num_prefill_nodes)

    @property
    def decode_ep_nodes(self) -> int:
        return min(self.num_decode_nodes, self.ep_group_decode_nodes or self.num_decode_nodes)

    def weight_shards(self, num_nodes: int) -> int:
        return num_nodes * self.node.gpus_per_node if self.expert_parallel else 1

    def kv_hbm_bytes_per_gpu(self, num_nodes: int) -> float:
        g = self.gpu_spec
        free = g.hbm_bytes * self.hbm_usable_fraction - self.model_spec.weight_bytes / self.weight_shards(num_nodes)
        if free <= 0:
            raise InputError(
                f"{self.model} does not fit on {num_nodes} node(s) of {g.name}: weights per GPU exceed usable HBM"
            )
        return free


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    max_len_tokens: int = 65536
    num_agents: int = 1024
    seed: int = 1
    append_scale: float = 1.0
    gen_scale: float = 1.0
    arrival_aps: float | None = None  # None = offline (all agents at t=0); else Poisson agents/s
    trajectory_file: str | None = None
    # Online runs: stop the clock at horizon_s (None = run until every agent finishes) and measure
    # latencies only over turns that arrive at or after warmup_s.
    horizon_s: float | None = None
    warmup_s: float = 0.0
    # choice: the share one unit of a deployment of `unit_of` units serves: num_agents x unit_of
    # agents generated, every unit_of-th of them by work kept, heaviest first, so that the unit's
    # load per agent and its heaviest agent are the deployment's (workloads/sample.py; `dualpath
    # plan` simulates units so, plan/workload.py); 1 = the agents as generated
    unit_of: int = 1
    # choice: tool time between an agent's rounds, log-normal (workloads/tool_time.py): its median in
    # seconds (0 = back to back, the paper's replay, docs/paper.md §4.2) and its sigma (spread of the
    # log; 1 = a tenth of the waits under 0.28x the median, a tenth over 3.6x)
    tool_time_median_s: float = 0.0
    tool_time_sigma: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.tool_time_median_s < float("inf") or not 0.0 <= self.tool_time_sigma < float("inf"):
            raise InputError(f"--tool-time and --tool-sigma must be finite and >= 0, got {self.tool_time_median_s} "
                             f"and {self.tool_time_sigma}")
        if self.unit_of < 1:
            raise InputError(f"workload.unit_of must be at least 1, got {self.unit_of}")
        if self.unit_of > 1 and self.trajectory_file:
            raise InputError("workload.unit_of samples generated agents; a trajectory file is replayed as it is")
        if self.num_agents <= 0:
            raise InputError(f"--agents must be positive, got {self.num_agents}")
        if self.max_len_tokens <= 0:
            raise InputError("--max-len must be positive")
        if self.append_scale <= 0 or self.gen_scale <= 0:
            raise InputError("append/gen scales must be positive")
        if self.arrival_aps is not None and self.arrival_aps <= 0:
            raise InputError("--aps must be positive")
        if self.horizon_s is not None and self.horizon_s <= 0:
            raise InputError("horizon_s must be positive")
        if self.warmup_s < 0 or (self.horizon_s is not None and self.warmup_s >= self.horizon_s):
            raise InputError("warmup_s must be >= 0 and below horizon_s")


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    # choice: window for SNIC Max/Avg balance (docs/paper.md §6.6: "a short window"; length not given).
    balance_window_s: float = 10.0
    # choice: windows whose mean SNIC read utilisation is below this are skipped; the paper drops
    # the tail where "both ratios lose meaning once the system is underloaded".
    balance_min_utilisation: float = 0.2


@dataclass(frozen=True, slots=True)
class SimConfig:
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    compute: ComputeKnobs = field(default_factory=ComputeKnobs)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    check_invariants_every: int = 0  # run ledger checks every N events (0 = only at the end)
    local: MeasuredMachine | None = None  # the `local` preset: measured step times (core/measured.py)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# Paper presets (docs/paper.md §5): model -> default P/D, DRAM buffer per node, parallelism.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "ds-v3.2-660b": {"pd": "2P4D", "dram_buffer_bytes": 80 * GB, "expert_parallel": True},
    "ds-27b": {"pd": "1P1D", "dram_buffer_bytes": 80 * GB, "expert_parallel": True},
    "qwen2.5-32b": {"pd": "1P2D", "dram_buffer_bytes": 320 * GB, "expert_parallel": False},
}


def paper_cluster(model: str, pd: str | None = None, **overrides: Any) -> ClusterConfig:
    try:
        spec = get_model(model)
    except KeyError as e:
        raise InputError(str(e.args[0])) from None
    preset = MODEL_PRESETS.get(spec.name, {"pd": "2P4D", "dram_buffer_bytes": 80 * GB, "expert_parallel": True})
    p, d = parse_pd(pd or preset["pd"])
    node = NodeSpec(dram_buffer_bytes=preset["dram_buffer_bytes"])
    return ClusterConfig(
        model=spec.name, num_prefill_nodes=p, num_decode_nodes=d, node=node,
        expert_parallel=preset["expert_parallel"], **overrides,
    )
