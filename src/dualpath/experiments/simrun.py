"""Run one simulation for an experiment: a frozen `SimSpec` -> the result JSON plus probes.

Every knob of a run comes from the paper presets (`config.paper_cluster`, `WorkloadConfig`);
a spec names only what the paper's experiment varies (model, P/D, MaxLen, agents, mode, append
and generation scale, APS with its horizon and warm-up), for Qwen 32B the GPU SKU, and, for the
hardware-only column of the report, `--set` assignments on the presets (`knobs`, e.g. every
fitted knob at its hardware-only estimate: `hardware_only`).

Probes are computed from the finished `Simulator` because `build_result` does not expose them
(see the report's "simulator changes" list): SNIC Max/Avg per window (Fig. 13), attention
Max/Avg over time (Fig. 14), and online-serving latencies that count turns still in flight at
the horizon (Figs. 10-12).

Results are cached in memory and on disk (`<out>/cache/`), keyed by the spec, the seed and a
fingerprint of the simulator's source, so experiments that share runs (Fig. 7, 8, 9, 12 and
Table 3) simulate them once and an interrupted suite resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import math
import os
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from .. import config
from ..config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from ..config.overrides import apply_overrides
from ..sim.bound import RunBound
from ..sim.runner import _clean, load_trajectories
from ..sim.simulator import Simulator
from .knobs import hardware_only_assignments

if TYPE_CHECKING:
    from .common import Context

# docs/paper.md §6.4: steady-state check over "a 150 s sliding window"; we use it as the window of the
# TTFT SLO check (a run fails if any window's mean TTFT is over the SLO).
ONLINE_WINDOW_S = 150.0
TTFT_SLO_S = 4.0  # docs/paper.md §6.4
TPOT_SLO_S = 0.050  # docs/paper.md §6.4
# docs/paper.md §6.4 compares TTFT with "its value 30 minutes earlier": a fixed-horizon run projects its
# fitted TTFT trend this far past the horizon (a run the paper would have continued).
PROJECTION_S = 1800.0
PROBE_VERSION = 2  # part of the cache key: bump when `probe` changes what it records


@dataclass(frozen=True, slots=True)
class SimSpec:
    model: str
    pd: str
    max_len_tokens: int
    num_agents: int
    mode: str
    append_scale: float = 1.0
    gen_scale: float = 1.0
    aps: float | None = None
    horizon_s: float | None = None
    warmup_s: float = 0.0
    gpu: str | None = None  # None = the preset's (h800)
    knobs: tuple[str, ...] = ()  # `--set` assignments applied to the presets; () = the presets
    tool_time_s: float = 0.0  # median tool time between an agent's rounds (workloads/tool_time.py; sigma 1)
    bound: RunBound | None = None  # stop once the run cannot come first (sim/bound.py, `dualpath plan`); None: to the end

    def label(self) -> str:
        base = f"{self.model} {self.pd} {self.max_len_tokens // 1024}K {self.mode}"
        knobs = f" [{', '.join(self.knobs)}]" if self.knobs else ""
        if self.aps is not None:
            return f"{base} {self.aps:.3g} APS{knobs}"
        extra = "" if self.append_scale == self.gen_scale == 1.0 else f" A x{self.append_scale:g} G x{self.gen_scale:g}"
        extra += f" tool {self.tool_time_s:g} s" if self.tool_time_s else ""
        extra += f" ({self.bound.describe()})" if self.bound is not None else ""
        return f"{base} {self.num_agents} agents{extra}{knobs}"

    def run_id(self) -> str:
        """The run's identity in a headline's `runs`: model, P/D, MaxLen, mode, agents and every
        other field that differs from its default, exact (the label rounds APS). The suite's runs
        share one seed, so two headlines with the same id rest on the same simulation."""
        defaults = {f.name: f.default for f in dataclasses.fields(SimSpec) if f.default is not dataclasses.MISSING}
        extra = [f"{k}={v!r}" for k, v in asdict(self).items() if k in defaults and v != defaults[k]]
        return " ".join([self.model, self.pd, f"MaxLen {self.max_len_tokens}", self.mode, f"{self.num_agents} agents", *extra])


def hardware_only(spec: SimSpec) -> SimSpec:
    """The same run with every fitted knob at its hardware-only estimate (experiments/knobs.py)."""
    return replace(spec, knobs=hardware_only_assignments())


def online_spec(model: str, pd: str, max_len_tokens: int, mode: str, aps: float, horizon_s: float, warmup_s: float,
                gpu: str | None = None) -> SimSpec:
    """Poisson arrivals at `aps` until the horizon: enough agents that arrivals outlast it."""
    num_agents = int(math.ceil(aps * horizon_s * 1.2)) + 16
    return SimSpec(model, pd, max_len_tokens, num_agents, mode, aps=aps, horizon_s=horizon_s, warmup_s=warmup_s, gpu=gpu)


def sim_config(spec: SimSpec, seed: int) -> SimConfig:
    parse_mode(spec.mode)
    overrides = {} if spec.gpu is None else {"gpu": spec.gpu}
    cluster = paper_cluster(spec.model, spec.pd, **overrides)
    workload = WorkloadConfig(
        max_len_tokens=spec.max_len_tokens, num_agents=spec.num_agents, seed=seed,
        append_scale=spec.append_scale, gen_scale=spec.gen_scale, arrival_aps=spec.aps,
        horizon_s=spec.horizon_s, warmup_s=spec.warmup_s, tool_time_median_s=spec.tool_time_s,
    )
    cfg = SimConfig(cluster=cluster, workload=workload)
    return apply_overrides(cfg, list(spec.knobs)) if spec.knobs else cfg


# Sources that cannot change a simulation's numbers: plotting, benchmarks, the runner's JSON and
# plot helpers. From config.py and the runner only the simulation's pieces are hashed (the runtime's
# config lives in the same file and changes often).
_NOT_SIMULATION = {"sim/runner.py", "metrics/plots.py"}
_SIM_CONFIG_SOURCES = (
    config.Features, config.parse_mode, config.parse_pd, config.ComputeKnobs, config.SchedulerConfig,
    config.ClusterConfig, config.WorkloadConfig, config.MetricsConfig, config.SimConfig, config.paper_cluster,
    load_trajectories,
)


@lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the simulation's source: a cached result is reused only for the same code."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for sub in ("sim", "core", "costmodel", "workloads", "metrics"):
        for p in sorted((root / sub).rglob("*.py")):
            rel = p.relative_to(root).as_posix()
            if rel not in _NOT_SIMULATION:
                h.update(rel.encode())
                h.update(p.read_bytes())
    for obj in _SIM_CONFIG_SOURCES:
        h.update(inspect.getsource(obj).encode())
    h.update(repr((config.MODE_PRESETS, config.MODEL_PRESETS)).encode())
    return h.hexdigest()[:16]


def _cache_key(spec: SimSpec, seed: int) -> str:
    fields = asdict(spec)
    if not spec.knobs:
        del fields["knobs"]  # the presets keep the keys they had before specs could carry knobs
    if not spec.tool_time_s:
        del fields["tool_time_s"]  # and the keys they had before specs could carry tool time
    if spec.bound is None:  # and before a run could be bounded
        del fields["bound"]
    blob = json.dumps({"spec": fields, "seed": seed, "code": code_fingerprint(), "probe": PROBE_VERSION}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


_TRAJ_CACHE: dict[WorkloadConfig, tuple] = {}  # one workload (its config less the measuring window) at a time


def _trajectories(cfg: SimConfig) -> tuple:
    w = cfg.workload
    key = replace(w, horizon_s=None, warmup_s=0.0)  # what the agents and their arrivals depend on
    if key not in _TRAJ_CACHE:
        _TRAJ_CACHE.clear()  # one workload at a time: 48K agents' trajectories are large
        _TRAJ_CACHE[key] = load_trajectories(cfg)
    return _TRAJ_CACHE[key]


def simulate(ctx: "Context", spec: SimSpec) -> dict[str, Any]:
    """The run's result dict (results.py keys) with `spec`, `seed` and `probe` added."""
    key = _cache_key(spec, ctx.seed)
    if key not in ctx.memo:
        ctx.memo[key] = _load_or_run(ctx, spec, key)
    result = ctx.memo[key]
    ctx.sim_wall_s[key] = result["wall_s"]
    ctx.sim_build[key] = result.get("build", "pure")  # results cached before builds were recorded were pure
    return result


def _load_or_run(ctx: "Context", spec: SimSpec, key: str) -> dict[str, Any]:
    cached = load_cached(ctx, spec, key)
    if cached is not None:
        return cached
    ctx.executor.starting()
    task = ctx.progress.start_sim(spec.label(), spec.num_agents)
    result = run_spec(spec, ctx.seed, lambda done, total: ctx.progress.update_sim(task, done, total))
    ctx.progress.end_sim(task)
    store_result(ctx, key, result)
    return result


def load_cached(ctx: "Context", spec: SimSpec, key: str) -> dict[str, Any] | None:
    """The result on disk under DIR/cache (announced to the progress sink), or None."""
    path = ctx.out_dir / "cache" / f"{key}.json"
    if ctx.use_disk_cache and path.is_file():
        ctx.progress.cached(spec.label())
        return json.loads(path.read_text())
    return None


def _no_progress(done: int, total: int) -> None:
    pass


def run_spec(spec: SimSpec, seed: int, progress: Callable[[int, int], None] = _no_progress) -> dict[str, Any]:
    """Simulate `spec` with `seed`: the result dict with `mode`, `spec`, `seed` and `probe`. Needs
    nothing of the context, so a worker process (deploy/ray/pool.py) runs it as the suite does.

    Always with a progress callable: `Simulator.run` with one runs its loop in chunks and stops
    later than without (its clock, and so the probes' durations, differ slightly), so a worker's
    result equals the suite's only if both pass one."""
    cfg = sim_config(spec, seed)
    trajs, arrivals = _trajectories(cfg)
    sim = Simulator(cfg, parse_mode(spec.mode), trajs, arrivals)
    result = sim.run(progress=progress, bound=spec.bound)
    result["mode"] = spec.mode
    result["spec"] = asdict(spec)
    result["seed"] = seed
    if "stopped" not in result:  # a stopped run (sim/bound.py) reports its bound only
        result["probe"] = probe(sim)
    return _clean(result)


def store_result(ctx: "Context", key: str, result: dict[str, Any]) -> None:
    if ctx.use_disk_cache:
        path = ctx.out_dir / "cache" / f"{key}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(result, sort_keys=True))
        tmp.replace(path)  # atomic: two suites sharing DIR never read a half-written file


# --- probes ------------------------------------------------------------------------------------
def probe(sim: Simulator) -> dict[str, Any]:
    out: dict[str, Any] = {"snic_windows": snic_windows(sim), "attention": attention_series(sim)}
    if sim.cfg.workload.arrival_aps is not None:
        out["online"] = online_metrics(sim)
    return out


def snic_windows(sim: Simulator) -> dict[str, list[float]]:
    """Per balance window: start time, Max/Avg of SNIC read bytes across nodes, mean utilisation."""
    samples = np.asarray(sim.snic_samples, dtype=float)
    window_s = sim.cfg.metrics.balance_window_s
    if samples.shape[0] < 2:
        return {"t_s": [], "max_over_avg": [], "mean_util": []}
    per_window = np.diff(samples, axis=0)
    avg = per_window.mean(axis=1)
    ratio = np.where(avg > 0, per_window.max(axis=1) / np.where(avg > 0, avg, 1.0), np.nan)
    util = avg / (sim.cfg.cluster.node.snic_read_bytes_per_s * window_s)
    return {"t_s": [i * window_s for i in range(len(avg))], "max_over_avg": ratio.tolist(), "mean_util": util.tolist()}


def attention_series(sim: Simulator) -> dict[str, Any]:
    """Attention-time Max/Avg across a group's GPUs per forward (Fig. 14), binned by the balance
    window, and its mean over the first 5% of the run (docs/paper.md §6.6)."""
    pts = sorted(p for g in sim.prefill_groups.values() for p in g.attention_balance)
    duration = sim.loop.now_s
    if not pts or duration <= 0:
        return {"t_s": [], "max_over_avg": [], "first_5pct_mean": float("nan")}
    t = np.array([p[0] for p in pts])
    r = np.array([p[1] for p in pts])
    window_s = sim.cfg.metrics.balance_window_s
    bins = (t // window_s).astype(int)
    sums = np.bincount(bins, weights=r)
    counts = np.bincount(bins)
    keep = counts > 0
    first = r[t <= 0.05 * duration]
    return {
        "t_s": (np.nonzero(keep)[0] * window_s).tolist(),
        "max_over_avg": (sums[keep] / counts[keep]).tolist(),
        "first_5pct_mean": float(first.mean()) if first.size else float("nan"),
    }


def online_metrics(sim: Simulator) -> dict[str, Any]:
    """Latencies over turns arriving in [warm-up, end), where end is the horizon.

    TTFT counts every such turn: finished ones, in-flight ones with a first token, and, censored
    at `end`, those still waiting (a lower bound; without them an overloaded run would look
    good). TTST and TPOT are over finished turns. The average trajectory JCT is from Little's law
    (mean agents in the system / arrival rate over the window), which needs no finished agents."""
    w = sim.cfg.workload
    start = w.warmup_s
    end = sim.loop.now_s if w.horizon_s is None else min(w.horizon_s, sim.loop.now_s)
    rec = sim.recorder
    arr = np.asarray(rec.arrival_s)
    first = np.asarray(rec.first_s)
    live = list(sim.inflight.values())
    live_arr = np.array([r.t_arrival for r in live], dtype=float)
    live_waiting = np.array([r.t_first < 0 for r in live], dtype=bool)
    live_first = np.where(live_waiting, end, np.array([r.t_first for r in live], dtype=float))
    all_arr = np.concatenate([arr, live_arr])
    all_ttft = np.concatenate([first - arr, live_first - live_arr])
    sel = (all_arr >= start) & (all_arr < end)
    order = np.argsort(all_arr[sel], kind="stable")
    t_arr, ttft = all_arr[sel][order], all_ttft[sel][order]
    windows = _window_means(t_arr, ttft, start, end)
    done = (arr >= start) & (arr < end)
    gen = np.asarray(rec.gen_tokens)[done]
    second = np.asarray(rec.second_s)[done]
    finish = np.asarray(rec.finish_s)[done]
    two, three = gen >= 2, gen >= 3
    tpot = (finish[three] - second[three]) / (gen[three] - 2)
    ttst = second[two] - first[done][two]
    thirds = np.array_split(ttft, 3) if ttft.size >= 3 else []
    return {
        "window_start_s": start,
        "window_end_s": end,
        "num_turns": int(ttft.size),
        "num_censored": int((live_waiting & (live_arr >= start) & (live_arr < end)).sum()),
        "ttft_mean_s": _mean(ttft),
        "ttft_p90_s": float(np.percentile(ttft, 90)) if ttft.size else float("nan"),
        "ttft_window_means_s": windows,
        "ttft_window_max_s": max(windows) if windows else float("nan"),
        # mean TTFT of the last third of the window's turns over the first third (1 = steady)
        "ttft_drift": _mean(thirds[2]) / _mean(thirds[0]) if thirds and _mean(thirds[0]) > 0 else float("nan"),
        "ttft_projected_s": _projected(t_arr, ttft, end),
        "ttst_mean_s": _mean(ttst),
        "tpot_mean_s": _mean(tpot),
        "trajectory_jct_s": _littles_law_jct(sim, start, end),
        "ttft_breakdown_s": _breakdown(sim, done),
    }


def _breakdown(sim: Simulator, done: np.ndarray) -> dict[str, float]:
    """Mean TTFT parts of finished turns, with the read split into the wait in the node's FIFO read
    queue and the transfer. The recorder keeps only their sum; the transfer is derived as hit bytes
    at the SNIC read rate, exact while one read per node runs at a time at the full rate
    (`reads_in_flight_per_node` = 1, no storage egress cap: the presets)."""
    rec = sim.recorder
    cl = sim.cfg.cluster
    exact = (cl.reads_in_flight_per_node == 1 and cl.storage_egress_bytes_per_s is None and not sim.features.io_free
             and not sim.features.dram_tier)  # a DRAM tier serves part of a hit without the SNIC
    read = np.asarray(rec.read_s)[done]
    hit_bytes = np.asarray(rec.hit_tokens, dtype=float)[done] * sim.kv_bytes_per_token
    transfer = np.minimum(read, hit_bytes / cl.node.snic_read_bytes_per_s) if exact else read
    return {
        "scheduling": _mean(np.asarray(rec.sched_s)[done]),
        "allocation": _mean(np.asarray(rec.alloc_s)[done]),
        "read_wait": _mean(read - transfer),
        "read_transfer": _mean(transfer),
        "prefill": _mean(np.asarray(rec.prefill_s)[done]),
    }


def _projected(t_arr: np.ndarray, ttft: np.ndarray, end: float) -> float:
    """Least-squares TTFT trend over the window, evaluated PROJECTION_S past `end` (a falling
    trend is not extrapolated: the value at `end`)."""
    if ttft.size < 3 or np.ptp(t_arr) <= 0:
        return _mean(ttft)
    slope, intercept = np.polyfit(t_arr, ttft, 1)
    return float(intercept + slope * end + max(0.0, slope) * PROJECTION_S)


def _window_means(t_arr: np.ndarray, values: np.ndarray, start: float, end: float) -> list[float]:
    """Mean of `values` per ONLINE_WINDOW_S window of arrival time over [start, end)."""
    if t_arr.size == 0 or end <= start:
        return []
    idx = ((t_arr - start) // ONLINE_WINDOW_S).astype(int)
    sums = np.bincount(idx, weights=values)
    counts = np.bincount(idx)
    return [float(s / c) for s, c in zip(sums, counts) if c > 0]


def _littles_law_jct(sim: Simulator, start: float, end: float) -> float:
    arr = np.array([a.arrival_s for a in sim.agents])
    fin = np.array([a.finish_s if a.finish_s >= 0 else end for a in sim.agents])
    overlap = np.clip(np.minimum(fin, end) - np.maximum(arr, start), 0.0, None)
    num_arrivals = int(((arr >= start) & (arr < end)).sum())
    if num_arrivals == 0 or end <= start:
        return float("nan")
    mean_in_system = overlap.sum() / (end - start)
    return float(mean_in_system / (num_arrivals / (end - start)))


def _mean(a: np.ndarray) -> float:
    return float(a.mean()) if a.size else float("nan")


def meets_slo(result: dict[str, Any]) -> bool:
    """docs/paper.md §6.4's SLO and stopping rule on a fixed horizon, on means: every 150 s window's mean
    TTFT <= 4 s (the paper stops a run once TTFT exceeds 4 s), the TTFT trend projected 30 minutes
    past the horizon <= 4 s (a run still drifting would have been continued until it did or
    settled), and the mean TPOT <= 50 ms."""
    on = result["probe"]["online"]
    values = (on["ttft_window_max_s"], on["ttft_projected_s"], on["tpot_mean_s"])
    if any(v is None or not math.isfinite(v) for v in values):
        return False
    ttft_max, projected, tpot = values
    return ttft_max <= TTFT_SLO_S and projected <= TTFT_SLO_S and tpot <= TPOT_SLO_S
