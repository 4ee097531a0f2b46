"""One typed config tree (simulator and runtime), validated on construction. Every number has its
unit in its name and its source in a comment; the CLI derives its options from these fields. A
knob's comment opens with `fitted (FIGURE; hardware-only: section.field=value):` when fitted to the
paper's own data, `choice:` when it is this project's choice, else cites its source (experiments/knobs.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from .core.lanes import LaneWeights
from .core.measured import MeasuredMachine
from .costmodel.models import ModelSpec, get_model
from .config_tp import TensorParallelConfig
from .costmodel.hardware import GB, GPUS, GpuSpec, NodeSpec
from .errors import InputError
from .parsing import parse_device, parse_pd


@dataclass(frozen=True, slots=True)
class Features:
    """Ablation switches (docs/paper.md §6.5). `basic` has none; `dualpath` all; `oracle` adds io_free."""

    layerwise_prefill: bool
    de_read_path: bool
    dualpath_scheduler: bool
    io_free: bool = False


_FEATURE_WORDS = {"layerwise": "layerwise_prefill", "de_read": "de_read_path", "scheduler": "dualpath_scheduler"}
MODE_PRESETS = {
    "basic": Features(False, False, False),
    "dualpath": Features(True, True, True),
    "oracle": Features(True, True, True, io_free=True),
}


def parse_mode(text: str) -> Features:
    """`basic`, `dualpath`, `oracle`, or `basic+W[+W...]` with W in layerwise, de_read, scheduler."""
    name = text.strip().lower()
    if name in MODE_PRESETS:
        return MODE_PRESETS[name]
    parts = name.split("+")
    if parts[0] != "basic" or len(parts) < 2 or any(p not in _FEATURE_WORDS for p in parts[1:]):
        raise InputError(
            f"unknown mode {text!r}: use basic, dualpath, oracle, or basic+{'/'.join(_FEATURE_WORDS)} combined with '+'"
        )
    return replace(MODE_PRESETS["basic"], **{_FEATURE_WORDS[p]: True for p in parts[1:]})


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
class SchedulerConfig:
    alpha_read_s: float = 3.0  # docs/paper.md §3.2, §5: short-read-queue threshold, seconds of reads
    beta_compute_s: float = 5.0  # docs/paper.md §3.2, §5: unfinished-token cap, seconds of GPU processing
    z_factor: float = 1.05  # docs/paper.md §3.3
    compute_quota_s: float = 0.300  # docs/paper.md §3.5: predicted attention time per PE forward
    # Basic engine batching: 16K tokens per GPU per prefill batch, DeepSeek's profiled prefill
    # setting (docs/hardware.md §7.1, [S-PROF]).
    basic_tokens_per_forward: int = 16384
    lane_weights: LaneWeights = field(default_factory=LaneWeights)
    # choice: read or recompute (core/policy/recompute.py): a hit whose read the store
    # would deliver later than a PE computes it again is recomputed. Off by default (the paper
    # always reads); for a degraded store.
    recompute_when_faster: bool = False

    def __post_init__(self) -> None:
        if min(self.alpha_read_s, self.beta_compute_s, self.z_factor, self.compute_quota_s) <= 0:
            raise InputError("scheduler thresholds must be positive")
        if self.basic_tokens_per_forward <= 0:
            raise InputError("basic_tokens_per_forward must be positive")


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
    # most `persist_wait_s` (RuntimeConfig.persist_wait_s; router.py: Router._try_place); and a
    # turn's last token has no KV until the next turn (sim/hits.py: last_token_next_turn). False:
    # a queued block counts as written at once (the paper presets: a write is ~1% of the SNIC).
    persist_waits_for_snic_write: bool = False
    persist_wait_s: float = 10.0  # RuntimeConfig.persist_wait_s's default; used with the flag above
    # The `local` preset's host buffers as the router holds them (`dualpath fidelity`; sim/persists.py;
    # Placement.allocate_regions): placement takes a Full Block slot per prompt block in the DE's
    # buffer (PE path: the PE's too) or holds its FIFO. False: reserved at first use, docs/paper.md §1.3.
    buffers_at_placement: bool = False
    # choice: seconds before a read's first byte arrives (a store's request latency); 0 = none, as
    # the paper's model of 3FS reads at line rate. A knob for a slow or stalled store.
    storage_read_latency_s: float = 0.0

    def __post_init__(self) -> None:
        if self.storage_read_latency_s < 0:
            raise InputError(f"storage_read_latency_s must be >= 0, got {self.storage_read_latency_s}")
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

    def __post_init__(self) -> None:
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


RUNTIME_BASIC_TOKENS_PER_FORWARD = 4096  # the runtime's basic engine: tokens per prefill forward (a CPU model)
DEMO_AGENTS = 4  # `dualpath demo` (runtime/apps/demo.py sizes the rest of the workload to the machine)
CNIC_PER_SNIC = 8  # docs/paper.md §1.2: 8 x 400 Gbps CNIC per node (one per GPU), 1 x 400 Gbps SNIC


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """The real runtime on one host: engine processes, emulated NICs, the KV store. A node is one
    engine, standing for a whole paper node, with its SNIC and host buffer. Rates are bytes/s per
    direction; None = real speed. A paper node's 8 CNICs are each as fast as its SNIC (docs/paper.md
    §1.2), so a one-engine node's CNIC defaults to CNIC_PER_SNIC x its SNIC (runtime/profile/emulation.py)."""

    model: str = "smollm2-135m"
    num_prefill: int = 1
    num_decode: int = 1
    mode: str = "dualpath"
    store_dir: str | None = None  # a directory or tcp://HOST:PORT (store serve); None: a fresh temporary directory
    store_capacity_bytes: int | None = None
    kv_dtype: str = "float32"
    block_tokens: int = 64  # docs/paper.md §1.5
    snic_bytes_per_s: float | None = None
    cnic_bytes_per_s: float | None = None  # None with a SNIC cap: CNIC_PER_SNIC x the SNIC rate
    # alpha/beta, Z, the compute quota, basic batching and the lane weights: the simulator's
    # SchedulerConfig, with the runtime's basic batch (RUNTIME_BASIC_TOKENS_PER_FORWARD)
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(
        basic_tokens_per_forward=RUNTIME_BASIC_TOKENS_PER_FORWARD))
    # Arbiter chunk: a latency-critical message waits at most one chunk; 8 KiB keeps a 64 KiB burst
    # within (64 + 8) / 64 = 1.125x of its unloaded time (`dualpath bench lanes`).
    chunk_bytes: int = 8 * 1024
    host_buffer_bytes: int = 512 * 2**20  # per node DRAM buffer (PE/DE buffer)
    pe_hbm_bytes: int = 256 * 2**20  # a PE's room for the batch's cached KV (the "HBM" landing zone)
    de_kv_tokens: int = 65536  # a DE's KV cache (HBM) capacity in tokens
    max_decode_batch: int = 64
    # A decode engine serves layer pulls and finished reads and copies between its step's layers, as
    # a real DE's NIC serves RDMA without its GPU (engine/mid_step.py). False: only between steps, so a
    # DE-path prefill waits up to one decode step per layer (the ablation; a run's `--timeline` shows
    # what it costs: the DE's `transfer` spans of the DE read path, metrics/timeline.py).
    de_serves_mid_step: bool = True
    # Compute quota (scheduler.compute_quota_s, 300 ms, docs/paper.md §3.5) kept as attention work at the
    # paper PE's rate (docs/hardware.md §1.2: FlashMLA sparse prefill, 640 TFLOPS). As 300 ms of a CPU's own
    # attention it chunked cold 3.8K-token prompts ~12 ways, each chunk reloading the earlier chunks' KV over the
    # CNIC (`dualpath run` on a cold Mooncake window; `dualpath bench cold` checks the fix).
    quota_attention_flops_per_s: float = 640e12
    # Fault injection, a slow store: seconds each node's storage reader waits before a read job's
    # first block (0 = none). The engines measure what a read's first block takes and report it
    # (Counters.read_latency_s), so the scheduler's read-or-recompute rule sees the store's latency.
    store_read_delay_s: float = 0.0
    # The engines read stored blocks with O_DIRECT (BlockStore direct_io), as a client reading SSDs
    # does: the page cache would serve a hot prefix from this host's DRAM, which a remote store (3FS,
    # docs/paper.md §1.1) never does. tmpfs refuses O_DIRECT: buffered reads after the first refusal.
    store_direct_io: bool = True
    # A call to a storage service (--store tcp://...) that has not answered after this many seconds
    # fails: a lookup finds nothing, a read is a miss (recomputed), a persist is WRITE_FAILED. A
    # frozen service then costs each call this bound instead of hanging it (`dualpath chaos`'s frozen-service case).
    # 5 s: a get of a prompt's blocks on loopback takes milliseconds (docs/results/store/service_vs_local.json).
    store_timeout_s: float = 5.0
    # Between engines: "local" (one host: ipc:// control, shared-memory KV) or "tcp" (as across hosts:
    # tcp:// control with LC marks, remote writes for KV, engine/peers.py; the token in peer_token_file
    # authenticates every peer, required beyond loopback: transport/peer_auth.py, remote_write/wire.py).
    engine_transport: str = "local"
    peer_token_file: str | None = None
    persist_wait_s: float = 10.0  # most a lookup waits for a block being persisted (docs/paper.md §1.5; ~0.1 s each)
    # per engine process; None: the size of the engine's CPU set (runtime/engine/cpus.py: one set per engine)
    torch_threads: int | None = None
    device: str = "cpu"  # cpu | cuda (engine e on GPU e mod #GPUs) | cuda:N (runtime/engine/device.py)
    seed: int = 0
    # Tests: read every hit on this side ("prefill" | "decode", a mode with that path) not the policy's
    force_read_side: str | None = None
    # Engine faults (runtime/router/liveness.py, recovery.py). An engine silent this long is fenced
    # (killed) and its requests recovered; it beats every timeout / HEARTBEATS_PER_TIMEOUT (5) from
    # a thread of its own, so a long forward never delays a beat. 5 s: 25x the 0.2 s a beat may
    # wait for a CPU when 4 engines share 2 cores at start-up, yet a frozen engine stalls a stream
    # at most 6 s. A process exit (SIGKILL, SIGTERM) is seen at once, without the timeout.
    engine_heartbeat_timeout_s: float = 5.0
    engine_fault_policy: str = "recompute"  # recompute (migrate, Dynamo-style) | fail (an error to the client)
    engine_fault_retries: int = 2  # migrations per request (each after its engine died) before an error
    engine_restart_wait_s: float = 0.0  # a role without engines waits for a restarted one (router/membership.py); 0: none
    # Fault injection (tests, `dualpath chaos --corruptions`): the probability, per checksummed
    # block piece an engine sends (layer streams, PD transfers; runtime/transport/integrity.py),
    # that one bit of it is flipped in flight. Each engine draws from its own RNG seeded by
    # (seed, engine id). 0 = off (the default): no injector is built, the copies are unchanged.
    kv_corrupt_probability: float = 0.0
    tp: TensorParallelConfig = field(default_factory=TensorParallelConfig)  # ranks per engine (config_tp.py)
    # Engines record their spans (metrics/timeline.py) and send them with their Counters; off (the
    # default) they hold the null timeline. `--timeline FILE` of demo and run turns it on.
    record_timeline: bool = False

    def __post_init__(self) -> None:
        parse_mode(self.mode)
        if self.engine_fault_policy not in ("recompute", "fail"):
            raise InputError(f"engine_fault_policy must be recompute or fail, got {self.engine_fault_policy!r}")
        if self.engine_heartbeat_timeout_s <= 0 or min(self.engine_fault_retries, self.engine_restart_wait_s) < 0:
            raise InputError("engine_heartbeat_timeout_s must be positive, engine_fault_retries and engine_restart_wait_s >= 0")
        if self.num_prefill <= 0 or self.num_decode <= 0:
            raise InputError("need at least one prefill and one decode engine")
        if not 0.0 <= self.kv_corrupt_probability <= 1.0:
            raise InputError(f"kv_corrupt_probability must be in [0, 1], got {self.kv_corrupt_probability}")
        for name in ("persist_wait_s", "store_read_delay_s"):
            if getattr(self, name) < 0:
                raise InputError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.store_timeout_s <= 0 or self.engine_transport not in ("local", "tcp"):
            raise InputError(f"need store_timeout_s > 0 (got {self.store_timeout_s}) and engine_transport local or tcp "
                             f"(got {self.engine_transport!r})")
        for name in ("quota_attention_flops_per_s", "block_tokens", "chunk_bytes", "host_buffer_bytes",
                     "pe_hbm_bytes", "de_kv_tokens", "max_decode_batch"):
            if getattr(self, name) <= 0:
                raise InputError(f"{name} must be positive")
        for name in ("snic_bytes_per_s", "cnic_bytes_per_s", "store_capacity_bytes", "torch_threads"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise InputError(f"{name} must be positive or None")
        if self.force_read_side not in (None, "prefill", "decode"):
            raise InputError(f"force_read_side must be prefill, decode or None, got {self.force_read_side!r}")
        if self.force_read_side == "decode" and not parse_mode(self.mode).de_read_path:
            raise InputError(f"force_read_side=decode needs the DE read path, which mode {self.mode!r} lacks")
        self.tp.check_device(parse_device(self.device)[0])
        if self.kv_dtype not in ("float32", "bfloat16", "float16"):
            raise InputError(f"kv_dtype must be float32, bfloat16 or float16, got {self.kv_dtype!r}")

    @property
    def features(self) -> Features:
        return parse_mode(self.mode)

    @property
    def cnic_rate(self) -> float | None:
        default = None if self.snic_bytes_per_s is None else CNIC_PER_SNIC * self.snic_bytes_per_s
        return default if self.cnic_bytes_per_s is None else self.cnic_bytes_per_s
