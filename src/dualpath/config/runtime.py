"""The runtime's config: `RuntimeConfig` is the cluster (model, P/D, mode, device) over typed
sections, one per concept: `links` (the emulated NICs), `engines` (what each engine process holds
and batches), `store` (the KV store), `transport` (between engines), `faults` (detection, recovery,
injection), `scheduler` (shared with the simulator) and `tp`. A choice is an enum, not a string;
`--set section.field=value` (overrides.py) reaches every field, as in the simulator."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError
from ..parsing import parse_device
from .features import Features, parse_mode
from .scheduler import SchedulerConfig
from .tp import TensorParallelConfig

RUNTIME_BASIC_TOKENS_PER_FORWARD = 4096  # the runtime's basic engine: tokens per prefill forward (a CPU model)
DEMO_AGENTS = 4  # `dualpath demo` (runtime/apps/demo.py sizes the rest of the workload to the machine)
CNIC_PER_SNIC = 8  # docs/paper.md §1.2: 8 x 400 Gbps CNIC per node (one per GPU), 1 x 400 Gbps SNIC


class EngineTransport(enum.StrEnum):
    LOCAL = "local"  # one host: ipc:// control, shared-memory KV
    TCP = "tcp"  # as across hosts: tcp:// control with LC marks, remote writes for KV (engine/peers.py)


class KvTransfer(enum.StrEnum):
    """Who moves KV bytes between engines as across hosts (transport.kind tcp); on one host a peer's
    shared memory is mapped. A field of its own, not a third `kind`: `kind` also decides the control
    channel (ipc or tcp) and whether engines may join over the network, and Mooncake changes neither."""

    REMOTE_WRITE = "remote-write"  # our TCP remote writes (transport/remote_write/)
    MOONCAKE = "mooncake"  # Mooncake Transfer Engine (transport/mooncake.py; `pip install 'dualpath[mooncake]'`)


class MooncakeProtocol(enum.StrEnum):
    TCP = "tcp"  # any host; what the tests run
    RDMA = "rdma"  # InfiniBand or RoCE NICs (transport.mooncake_devices names them)


# InfiniBand service levels are 0-15 (docs/hardware.md §2.2)
IB_SERVICE_LEVELS = 16


class FaultPolicy(enum.StrEnum):
    RECOMPUTE = "recompute"  # migrate the request to live engines (Dynamo-style; router/recovery.py)
    FAIL = "fail"  # end its stream with an error (HTTP 503)


class KvDtype(enum.StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"


class ForcedSide(enum.StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"


def choice(kind: type[enum.StrEnum], value: Any, name: str) -> Any:
    """`value` as a member of `kind` (a member or its text), or an InputError naming the choices."""
    try:
        return kind(value)
    except ValueError:
        raise InputError(f"{name} must be one of {', '.join(m.value for m in kind)}, got {value!r}") from None


def _set(obj: Any, name: str, value: Any) -> None:
    object.__setattr__(obj, name, value)  # a frozen section normalises its own field once, on construction


def _positive(obj: Any, names: tuple[str, ...], section: str, optional: bool = False) -> None:
    for name in names:
        v = getattr(obj, name)
        if (v is not None or not optional) and (v is None or v <= 0):
            raise InputError(f"{section}.{name} must be positive{' or None' if optional else ''}, got {v}")


@dataclass(frozen=True, slots=True)
class LinkConfig:
    """A node's emulated NICs, bytes/s per direction; None = real speed. A paper node's 8 CNICs are
    each as fast as its SNIC (docs/paper.md §1.2), so a one-engine node's CNIC defaults to
    CNIC_PER_SNIC x its SNIC (runtime/profile/emulation.py)."""

    snic_bytes_per_s: float | None = None
    cnic_bytes_per_s: float | None = None  # None with a SNIC cap: CNIC_PER_SNIC x the SNIC rate
    # Arbiter chunk: a latency-critical message waits at most one chunk; 8 KiB keeps a 64 KiB burst
    # within (64 + 8) / 64 = 1.125x of its unloaded time (`dualpath bench lanes`).
    chunk_bytes: int = 8 * 1024

    def __post_init__(self) -> None:
        _positive(self, ("snic_bytes_per_s", "cnic_bytes_per_s"), "links", optional=True)
        _positive(self, ("chunk_bytes",), "links")

    @property
    def cnic_rate(self) -> float | None:
        default = None if self.snic_bytes_per_s is None else CNIC_PER_SNIC * self.snic_bytes_per_s
        return default if self.cnic_bytes_per_s is None else self.cnic_bytes_per_s


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What each engine process holds and how it batches."""

    host_buffer_bytes: int = 512 * 2**20  # per node DRAM buffer (PE/DE buffer)
    pe_hbm_bytes: int = 256 * 2**20  # a PE's room for the batch's cached KV (the "HBM" landing zone)
    de_kv_tokens: int = 65536  # a DE's KV cache (HBM) capacity in tokens
    max_decode_batch: int = 64
    # A decode engine serves layer pulls and finished reads and copies between its step's layers, as
    # a real DE's NIC serves RDMA without its GPU (engine/mid_step.py). False: only between steps, so a
    # DE-path prefill waits up to one decode step per layer (the ablation; a run's `--timeline` shows
    # what it costs: the DE's `transfer` spans of the DE read path, metrics/timeline.py).
    de_serves_mid_step: bool = True
    # A decode engine keeps its running batch's K,V dense and appends to it each step (runtime/model/
    # decode_workspace.py: x1.2 decode steps on CPU, `dualpath bench model-speed`) at the price of a
    # second copy of the batch's KV; False: every step gathers the batch's blocks (no second copy).
    de_decode_workspace: bool = True
    # Compute quota (scheduler.compute_quota_s, 300 ms, docs/paper.md §3.5) kept as attention work at the
    # paper PE's rate (docs/hardware.md §1.2: FlashMLA sparse prefill, 640 TFLOPS). As 300 ms of a CPU's own
    # attention it chunked cold 3.8K-token prompts ~12 ways, each chunk reloading the earlier chunks' KV over the
    # CNIC (`dualpath run` on a cold Mooncake window; `dualpath bench cold` checks the fix).
    quota_attention_flops_per_s: float = 640e12
    # per engine process; None: the size of the engine's CPU set (runtime/engine/cpus.py: one set per engine)
    torch_threads: int | None = None

    def __post_init__(self) -> None:
        _positive(self, ("quota_attention_flops_per_s", "host_buffer_bytes", "pe_hbm_bytes", "de_kv_tokens",
                         "max_decode_batch"), "engines")
        _positive(self, ("torch_threads",), "engines", optional=True)


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """The KV store the engines read hits from and persist blocks to."""

    location: str | None = None  # a directory or tcp://HOST:PORT (store serve); None: a fresh temporary directory
    capacity_bytes: int | None = None
    # The engines read stored blocks with O_DIRECT (BlockStore direct_io), as a client reading SSDs
    # does: the page cache would serve a hot prefix from this host's DRAM, which a remote store (3FS,
    # docs/paper.md §1.1) never does. tmpfs refuses O_DIRECT: buffered reads after the first refusal.
    direct_io: bool = True
    # A call to a storage service (--store tcp://...) that has not answered after this many seconds
    # fails: a lookup finds nothing, a read is a miss (recomputed), a persist is WRITE_FAILED. A
    # frozen service then costs each call this bound instead of hanging it (`dualpath chaos`'s frozen-service case).
    # 5 s: a get of a prompt's blocks on loopback takes milliseconds (docs/results/store/service_vs_local.json).
    timeout_s: float = 5.0
    persist_wait_s: float = 10.0  # most a lookup waits for a block being persisted (docs/paper.md §1.5; ~0.1 s each)
    # choice: `+dram` (core/dram.py), each engine's host memory kept for Full Blocks it read or
    # persisted (every engine is its own node here). 64 MiB holds 22 of the embedded model's Full
    # Blocks (2.8 MiB each: 64 tokens of float32 KV), a part of the demo's working set (its four
    # agents read 1.9 GB in 68 turns, docs/results/runtime/demo_modes.json): a tier that evicts.
    dram_tier_mb: float = 64.0

    def __post_init__(self) -> None:
        if self.dram_tier_mb < 0:
            raise InputError(f"store.dram_tier_mb must be >= 0, got {self.dram_tier_mb}")
        _positive(self, ("timeout_s",), "store")
        _positive(self, ("capacity_bytes",), "store", optional=True)
        if self.persist_wait_s < 0:
            raise InputError(f"store.persist_wait_s must be >= 0, got {self.persist_wait_s}")


@dataclass(frozen=True, slots=True)
class TransportConfig:
    """Between engines. `tcp`: the token in `peer_token_file` authenticates every peer, required
    beyond loopback (transport/peer_auth.py, remote_write/wire.py). `transfer` mooncake: the KV
    bytes through Mooncake Transfer Engine instead (transport/mooncake.py; the token still guards
    the control channel, Mooncake's own data plane has no authentication)."""

    kind: EngineTransport = EngineTransport.LOCAL
    peer_token_file: str | None = None
    # Across hosts, who writes the KV bytes into a peer's memory: our TCP remote writes, or Mooncake
    # Transfer Engine (needs kind tcp for its control channel; refused at start without the package).
    transfer: KvTransfer = KvTransfer.REMOTE_WRITE
    mooncake_protocol: MooncakeProtocol = MooncakeProtocol.TCP  # transfer mooncake: rdma where the NICs have it
    mooncake_devices: str = ""  # transfer mooncake, rdma: NICs to use, comma-separated (mlx5_0,mlx5_1); "": all found
    # transfer mooncake, rdma: the service level of the KV lane's queue pairs (MC_IB_SL). docs/paper.md §2.3
    # puts KV on VL2, the one VL weighted only in the low arbiter table; the paper gives no SL -> VL table,
    # and OpenSM's default (`sl2vl 0..14,7`, docs/hardware.md §2.2) maps SL 2 to VL2.
    mooncake_kv_sl: int = 2

    def __post_init__(self) -> None:
        _set(self, "kind", choice(EngineTransport, self.kind, "transport.kind"))
        _set(self, "transfer", choice(KvTransfer, self.transfer, "transport.transfer"))
        _set(self, "mooncake_protocol", choice(MooncakeProtocol, self.mooncake_protocol, "transport.mooncake_protocol"))
        if self.transfer is KvTransfer.MOONCAKE and self.kind is not EngineTransport.TCP:
            raise InputError("transport.transfer mooncake moves KV between hosts: it needs transport.kind tcp")
        if not 0 <= self.mooncake_kv_sl < IB_SERVICE_LEVELS:
            raise InputError(f"transport.mooncake_kv_sl must be in [0, {IB_SERVICE_LEVELS - 1}], got {self.mooncake_kv_sl}")


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Engine faults (runtime/router/membership.py, recovery.py) and the faults a test injects."""

    # An engine silent this long is fenced (killed) and its requests recovered; it beats every
    # timeout / HEARTBEATS_PER_TIMEOUT (5) from a thread of its own, so a long forward never delays
    # a beat. 5 s: 25x the 0.2 s a beat may wait for a CPU when 4 engines share 2 cores at start-up,
    # yet a frozen engine stalls a stream at most 6 s. A process exit (SIGKILL, SIGTERM) is seen at
    # once, without the timeout.
    heartbeat_timeout_s: float = 5.0
    policy: FaultPolicy = FaultPolicy.RECOMPUTE
    retries: int = 2  # migrations per request (each after its engine died) before an error
    restart_wait_s: float = 0.0  # a role without engines waits for a restarted one (router/membership.py); 0: none
    # Injection (tests, `dualpath chaos --corruptions`): the probability, per checksummed block piece
    # an engine sends (layer streams, PD transfers; runtime/transport/integrity.py), that one bit of
    # it is flipped in flight. Each engine draws from its own RNG seeded by (seed, engine id).
    # 0 = off (the default): no injector is built, the copies are unchanged.
    kv_corrupt_probability: float = 0.0
    # Injection, a slow store: seconds each node's storage reader waits before a read job's first
    # block (0 = none). The engines measure what a read's first block takes and report it
    # (Counters.read_latency_s), so the scheduler's read-or-recompute rule sees the store's latency.
    store_read_delay_s: float = 0.0

    def __post_init__(self) -> None:
        _set(self, "policy", choice(FaultPolicy, self.policy, "faults.policy"))
        _positive(self, ("heartbeat_timeout_s",), "faults")
        if min(self.retries, self.restart_wait_s, self.store_read_delay_s) < 0:
            raise InputError("faults.retries, faults.restart_wait_s and faults.store_read_delay_s must be >= 0")
        if not 0.0 <= self.kv_corrupt_probability <= 1.0:
            raise InputError(f"faults.kv_corrupt_probability must be in [0, 1], got {self.kv_corrupt_probability}")


@dataclass(frozen=True, slots=True)
class RuntimeConfig:
    """The real runtime: engine processes, emulated NICs, the KV store. A node is one engine,
    standing for a whole paper node, with its SNIC and host buffer."""

    model: str = "smollm2-135m"
    num_prefill: int = 1
    num_decode: int = 1
    mode: str = "dualpath"  # basic | dualpath | oracle | dualpath+split | basic+W[+W] (features.py)
    device: str = "cpu"  # cpu | cuda (engine e on GPU e mod #GPUs) | cuda:N (runtime/engine/device.py)
    seed: int = 0
    kv_dtype: KvDtype = KvDtype.FLOAT32
    block_tokens: int = 64  # docs/paper.md §1.5
    # Tests: read every hit on this side (a mode with that path) not the policy's
    force_read_side: ForcedSide | None = None
    # Engines record their spans (metrics/timeline.py) and send them with their Counters; off (the
    # default) they hold the null timeline. `--timeline FILE` of demo and run turns it on.
    record_timeline: bool = False
    links: LinkConfig = field(default_factory=LinkConfig)
    engines: EngineConfig = field(default_factory=EngineConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    # alpha/beta, Z, the compute quota, basic batching and the lane weights: the simulator's
    # SchedulerConfig, with the runtime's basic batch (RUNTIME_BASIC_TOKENS_PER_FORWARD)
    scheduler: SchedulerConfig = field(default_factory=lambda: SchedulerConfig(
        basic_tokens_per_forward=RUNTIME_BASIC_TOKENS_PER_FORWARD))
    tp: TensorParallelConfig = field(default_factory=TensorParallelConfig)  # ranks per engine (tp.py)

    def __post_init__(self) -> None:
        features = parse_mode(self.mode)
        _set(self, "kv_dtype", choice(KvDtype, self.kv_dtype, "kv_dtype"))
        if self.force_read_side is not None:
            _set(self, "force_read_side", choice(ForcedSide, self.force_read_side, "force_read_side"))
        if self.num_prefill <= 0 or self.num_decode <= 0:
            raise InputError("need at least one prefill and one decode engine")
        _positive(self, ("block_tokens",), "config")
        if self.force_read_side is ForcedSide.DECODE and not features.de_read_path:
            raise InputError(f"force_read_side=decode needs the DE read path, which mode {self.mode!r} lacks")
        self.tp.check_device(parse_device(self.device)[0])

    @property
    def features(self) -> Features:
        return parse_mode(self.mode)
