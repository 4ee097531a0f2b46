"""The simulator's `local` preset: the local runtime cluster as the simulator sees it.

What it takes from a measurement, and from where:
  - step times: the compute profile of this machine (runtime/profile/calibrate.py: the file
    `dualpath calibrate` caches and prints, the one the demo reads), a least-squares fit of prefill
    and decode steps each timed alone; scaled per role by the speed the caller passes. `dualpath
    fidelity` passes (fidelity/calibration.py) the drift timed right before each scored run (the
    profile's warm points timed again) times the contention measured on calibration workloads'
    runs, never on the scored runs; the scored runs' own speed is only the `replayed` diagnostic;
  - the model's KV bytes per token and attention FLOPs (costmodel/models.py, checked against the
    runtime's loader by tests/sim/test_local_preset.py).
Everything else is the runtime's configuration, not a measurement:
  - the emulated SNIC and CNIC rates of the run (runtime/profile/emulation.py), one engine per node;
  - the runtime config: block size, host buffers, the PE landing zone, the DE's KV tokens, the
    scheduler config (alpha, beta, quota, basic batch, lane weights), the quota's attention rate;
  - storage reads: one reader per node, strict FIFO (the engine's reader thread);
  - each engine's CNIC: one link for both directions, FIFO per lane, every copy paced by the
    engine that makes it (the engine's LinkArbiter, runtime/transport/arbiter.py; config.py:
    cnic_as_runtime_arbiter), the decode engine's D2H of each persisted block included;
  - the decode engine's step boundaries: a request's H2D starts, and it joins the batch, when the
    running step ends (config.py: decode_waits_for_step_end; the runtime's DE serves only layer
    pulls and finished reads and copies between a step's layers, engine/mid_step.py);
  - persists: each DE node writes its blocks one at a time through the SNIC's write bucket, and
    placement waits for a hit block still being written, at most `persist_wait_s` (config.py:
    persist_waits_for_snic_write; sim/persists.py); a turn's generated blocks are written as they
    filled during its decode (`PersistWrites.submit_generated`);
  - host buffers: placement takes the prompt's slots in the DE buffer (and the PE buffer on the PE
    path) or holds its FIFO, as the router's `Placement.allocate_regions` (config.py:
    buffers_at_placement; sim/persists.py: PlacementGate).
Not modelled (so counted in the reported error, not tuned away; the scored runs are in
docs/results/fidelity/):
per-message and per-copy overheads of the runtime's processes, the DE's decode batch cap
(RuntimeConfig.engines.max_decode_batch), the store's own write time, and the D2H copy of a generated
block when it fills (booked at the turn's end). The runtime sends one pass's assignments to an
engine together (router.py: SendsTogether) and simultaneous arrivals in workload order
(replay.py), so both worlds batch the same requests; the PE serves its mail between layers, so a
finished PD copy is announced during the next forward, as the simulator announces it at once.
"""

from __future__ import annotations

from dataclasses import replace

from ..config import ClusterConfig, RuntimeConfig, SimConfig, WorkloadConfig
from ..costmodel.hardware import NodeSpec
from ..core.measured import MeasuredMachine
from ..costmodel.models import get_model
from ..errors import InputError
from .speed import SpeedModel, decode_grid


def local_sim_config(runtime: RuntimeConfig, profile, kv_bytes_per_token: int, source: str,
                     speed: SpeedModel = SpeedModel(), max_len_tokens: int = 65536) -> SimConfig:
    """`profile`: a runtime ComputeProfile (prefill_fit, decode_fit: fixed_s, per_item_s, per_key_s,
    per_ctx_s; decode: the measured steps, interpolated when they form a grid), run at `speed`."""
    if runtime.links.snic_bytes_per_s is None or runtime.links.cnic_rate is None:
        raise InputError("the local preset needs emulated SNIC and CNIC rates (a run at real speed has no rate to model)")
    try:
        model = get_model(runtime.model)
    except KeyError:
        raise InputError(f"model {runtime.model!r} has no simulator spec (costmodel/models.py)") from None
    if model.kv_bytes_per_token != kv_bytes_per_token:
        raise InputError(f"{runtime.model}: the simulator's spec holds {model.kv_bytes_per_token} KV bytes per token, the "
                         f"runtime {kv_bytes_per_token} (kv_dtype {runtime.kv_dtype}); the preset assumes float32 KV")
    node = NodeSpec(gpus_per_node=1, cnic_bytes_per_s=runtime.links.cnic_rate, snic_bytes_per_s=runtime.links.snic_bytes_per_s,
                    dram_buffer_bytes=float(runtime.engines.host_buffer_bytes), storage_read_bytes_per_s=None)
    cluster = ClusterConfig(model=model.name, num_prefill_nodes=runtime.num_prefill, num_decode_nodes=runtime.num_decode,
                            node=node, block_tokens=runtime.block_tokens, reads_in_flight_per_node=1,
                            expert_parallel=False, cnic_as_runtime_arbiter=True,
                            decode_waits_for_step_end=True, persist_waits_for_snic_write=True,
                            persist_wait_s=runtime.store.persist_wait_s, buffers_at_placement=True,
                            dram_tier_gb_per_node=runtime.store.dram_tier_mb * 2**20 / 1e9)  # `+dram`: the engine's tier
    pf, df, kp, kd = profile.prefill_fit, profile.decode_fit, speed.prefill_scale, speed.decode_scale
    grid = decode_grid(profile)
    machine = MeasuredMachine(
        prefill_fixed_s=kp * pf.fixed_s, prefill_per_token_s=kp * pf.per_item_s, prefill_per_key_s=kp * pf.per_key_s,
        decode_fixed_s=kd * df.fixed_s, decode_per_seq_s=kd * df.per_item_s, decode_per_key_s=kd * df.per_key_s,
        decode_per_ctx_s=kd * df.per_ctx_s,
        quota_attention_flops_per_s=runtime.engines.quota_attention_flops_per_s, attention_flops_per_key=model.attn_flops_per_key,
        pe_landing_bytes=float(runtime.engines.pe_hbm_bytes), de_kv_tokens=runtime.engines.de_kv_tokens, source=source,
        decode_grid=None if grid is None else grid.scaled(speed.decode_scale),
        prefill_overhead_s=speed.prefill_overhead_s, decode_io_slowdown=speed.decode_io_slowdown,
        decode_join_s=speed.decode_join_s)
    return SimConfig(cluster=cluster, scheduler=replace(runtime.scheduler), local=machine,
                     workload=WorkloadConfig(max_len_tokens=max_len_tokens))
