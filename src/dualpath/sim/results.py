"""A finished simulation as JSON-ready numbers (names shared with the runtime's metrics)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Protocol

import numpy as np

from .._build import build_kind
from ..core.lanes import Lane
from ..core.snapshot import ReadSide
from ..config import Features, SimConfig
from ..metrics import TurnRecorder, distribution, snic_balance, turn_latencies
from .dispatch import Dispatch
from .events import EventLoop
from .persists import PersistWrites
from .reads import StorageReads


class FinishedRun(Protocol):
    """What a result reads of a finished simulation (the Simulator provides it)."""

    cfg: SimConfig
    features: Features
    loop: EventLoop
    recorder: TurnRecorder
    agents: list
    nodes: list
    engines_by_id: dict
    prefill_groups: dict
    decode_groups: dict
    reads: StorageReads
    driver: Dispatch
    profile: dict
    writes: PersistWrites
    h2d_bytes: float
    num_recomputed: int  # hits computed again instead of read (read or recompute)
    snic_samples: list  # per sample: cumulative SNIC-in KV bytes per node


def _utilisation(links: list, duration_s: float, lane: int | None = None) -> list[float]:
    out = []
    for link in links:
        served = sum(link.served_bytes) if lane is None else link.served_bytes[lane]
        out.append(served / (link.capacity_bytes_per_s * duration_s) if duration_s > 0 else 0.0)
    return out


def _window_bytes(sim: FinishedRun) -> np.ndarray:
    samples = np.asarray(sim.snic_samples, dtype=float)
    if samples.shape[0] < 2:
        return np.zeros((0, len(sim.nodes)))
    return np.diff(samples, axis=0)


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else float("nan")


def _attention_balance(sim: FinishedRun) -> float:
    """Mean over forwards of max/avg attention time across a group's GPUs (docs/paper.md §6.6, Fig. 14)."""
    ratios = [r for g in sim.prefill_groups.values() for _, r in g.attention_balance]
    return float(np.mean(ratios)) if ratios else float("nan")


def _byte_totals(sim: FinishedRun, cnics: list) -> dict[str, float]:
    dram = sim.reads.dram_bytes_by_side  # taken from a node's DRAM tier instead of storage (`+dram`)
    return {
        "storage_to_prefill": sim.reads.bytes_by_side[ReadSide.PREFILL],
        "storage_via_decode": sim.reads.bytes_by_side[ReadSide.DECODE],
        **({"dram_to_prefill": dram[ReadSide.PREFILL], "dram_via_decode": dram[ReadSide.DECODE]} if sim.features.dram_tier else {}),
        "persisted": sim.writes.persisted_bytes,
        "kv_layer_streams": sum(g.stream_bytes for g in sim.prefill_groups.values()),
        "pd_transfer": sum(g.pd_bytes for g in sim.prefill_groups.values()),
        "de_h2d": sim.h2d_bytes,
        "cnic_lane_kv": sum(l.served_bytes[Lane.KV] for l in cnics) / 2,
        "cnic_lane_latency_critical": sum(l.served_bytes[Lane.LATENCY_CRITICAL] for l in cnics) / 2,
    }


def _persists(sim: FinishedRun) -> dict[str, int]:
    """Blocks written through the SNIC write buckets; requests placement held for one, or for
    buffer room (persists.py)."""
    gate = sim.driver.gate
    return {"blocks_written": sim.writes.num_written, "requests_waited": gate.num_waited,
            "requests_gave_up": gate.num_gave_up, "requests_waited_for_buffers": gate.num_buffer_waits}


def _nic_utilisation(snic_read_util: list[float], snic_out: list, cnics: list, duration_s: float) -> dict[str, Any]:
    return {
        "snic_read_by_node": snic_read_util,
        "snic_write_by_node": _utilisation(snic_out, duration_s),
        "cnic_mean": float(np.mean(_utilisation(cnics, duration_s))) if cnics else 0.0,
        "cnic_max": float(np.max(_utilisation(cnics, duration_s))) if cnics else 0.0,
    }


def build_result(sim: FinishedRun, wall_s: float) -> dict[str, Any]:
    rec = sim.recorder
    keep = np.asarray(rec.arrival_s) >= sim.cfg.workload.warmup_s  # online: skip the warm-up
    arrival = np.asarray(rec.arrival_s)[keep]
    first = np.asarray(rec.first_s)[keep]
    second = np.asarray(rec.second_s)[keep]
    finish = np.asarray(rec.finish_s)[keep]
    gen = np.asarray(rec.gen_tokens)[keep]
    done = [a for a in sim.agents if a.finish_s >= 0]
    all_done = len(done) == len(sim.agents)
    jct_s = (max(a.finish_s for a in sim.agents) - min(a.arrival_s for a in sim.agents)) if all_done else float("nan")
    agent_jct = [a.finish_s - a.arrival_s for a in done]
    duration = sim.loop.now_s
    snic_in = [n.snic_in for n in sim.nodes]
    snic_out = [n.snic_out for n in sim.nodes]
    cnics = [l for e in sim.engines_by_id.values() for l in (e.cnic_out, e.cnic_in)]
    cfg = sim.cfg
    window_capacity = cfg.cluster.node.snic_read_bytes_per_s * cfg.metrics.balance_window_s
    pe_busy = [g.busy_s / duration for g in sim.prefill_groups.values()] if duration > 0 else []
    de_busy = [g.busy_s / duration for g in sim.decode_groups.values()] if duration > 0 else []
    snic_read_util = _utilisation(snic_in, duration)
    return {
        "mode": None,  # filled in by the caller
        "features": _features(sim.features),
        "jct_s": jct_s,
        "agent_jct_s": distribution(agent_jct).to_dict(),
        **turn_latencies(arrival, first, second, finish, gen),
        "ttft_breakdown_mean_s": {
            "scheduling": _mean(np.asarray(rec.sched_s)[keep]),
            "allocation": _mean(np.asarray(rec.alloc_s)[keep]),
            "read": _mean(np.asarray(rec.read_s)[keep]),
            "prefill": _mean(np.asarray(rec.prefill_s)[keep]),
        },
        "bytes": _byte_totals(sim, cnics),
        "snic_max_over_avg": snic_balance(_window_bytes(sim), window_capacity, cfg.metrics.balance_min_utilisation),
        "snic_max_over_avg_run": (max(snic_read_util) / float(np.mean(snic_read_util))) if np.mean(snic_read_util) > 0 else float("nan"),
        "nic_utilisation": _nic_utilisation(snic_read_util, snic_out, cnics, duration),
        "gpu_busy": {
            "prefill_mean": float(np.mean(pe_busy)) if pe_busy else 0.0,
            "decode_mean": float(np.mean(de_busy)) if de_busy else 0.0,
        },
        "scheduler": _scheduler(sim),
        **({"persists": _persists(sim)} if sim.writes.modelled else {}),
        "policy_wall_s": sim.driver.policy_cpu_s,
        "prefill_attention_max_over_avg": _attention_balance(sim),
        "prefill_forwards": sum(g.num_forwards for g in sim.prefill_groups.values()),
        "num_agents": len(sim.agents),
        "num_agents_finished": len(done),
        "horizon_s": sim.cfg.workload.horizon_s,
        "num_turns": len(rec),
        "cached_tokens": int(sum(rec.hit_tokens)),  # the hits placement fixed (the runtime replay's key)
        "num_events": sim.loop.num_events,
        "sim_duration_s": duration,
        "wall_s": wall_s,
        "turns_per_wall_s": len(rec) / wall_s if wall_s > 0 else float("nan"),
        "build": build_kind(),  # 'pure' or 'compiled' (mypyc): changes wall times only
    }


def _scheduler(sim: Any) -> dict[str, Any]:
    """The profile behind alpha and beta, the pass counts, and the counts of the mode's options."""
    f = sim.features
    return {**sim.profile, "passes": sim.driver.num_passes, "decisions": sim.driver.num_decisions,
            **({"recomputed_hits": sim.num_recomputed} if sim.cfg.scheduler.recompute_when_faster else {}),
            **({"split_reads": sim.reads.num_split} if f.split_reads else {}),
            **({"local_prefills": sum(g.num_local_prefills for g in sim.decode_groups.values())} if f.local_prefill else {})}


def _features(features: Features) -> dict[str, bool]:
    """The mode's switches; `split_reads`, `tail_share`, `local_prefill` and `dram_tier` (beyond the
    paper) only when on, so that the paper's modes write the results they wrote before they existed."""
    out = asdict(features)
    for beyond in ("split_reads", "tail_share", "local_prefill", "dram_tier"):
        if not out[beyond]:
            del out[beyond]
    return out
