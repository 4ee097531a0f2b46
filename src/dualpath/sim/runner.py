"""Run the simulator for a config and a list of modes; JSON result and a plot.

JSON layout (the runtime's `dualpath demo` writes the same keys): `config` (the resolved config
tree), `workload` (its Table-2 statistics; for a Mooncake trace `mooncake_stats` of the replayed
requests, with the replay's `time_scale` and `limit`), `runs` (one object per mode; see results.py).

The workload file (`workload.trajectory_file`) is trajectory JSONL, an agentic Mooncake trace
(sessions, workloads/agentic.py) or a Mooncake trace, told apart by `workloads.detect_format`;
an agent's rounds wait their tool time (`TurnSpec.wait_s`: the file's, or `workload.tool_time_*`).
A trace is replayed open loop as `dualpath run` replays it (`runtime/apps/run.py:run_trace`,
`replay.py:replay_mooncake`): the first `limit` records with input + output <= max_len, each a
one-turn agent (`sim.hits.TraceRequest`) arriving at (timestamp - first timestamp) * time_scale;
hits come from a simulated store (`sim.hits.StoreHits`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import SimConfig, parse_mode
from ..errors import InputError
from .hits import TraceRequest
from .bound import RunBound
from .simulator import Simulator

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True, slots=True)
class TraceReplay:
    """How a Mooncake trace is replayed: `dualpath run`'s options and meanings (cli/runtime.py:run);
    by default the whole trace, where `run` takes its first 8 requests to save time."""

    time_scale: float = 1.0  # request i arrives at (timestamp_i - first timestamp) * time_scale, s
    limit: int | None = None  # replay the first `limit` records whose input + output tokens fit max_len (None: all)

    def __post_init__(self) -> None:
        if not self.time_scale >= 0:  # also refuses NaN
            raise InputError(f"--time-scale must be >= 0, got {self.time_scale}")
        if self.limit is not None and self.limit <= 0:
            raise InputError(f"--limit must be positive, got {self.limit}")


@dataclass(frozen=True, slots=True)
class Workload:
    agents: tuple[Any, ...]  # Trajectory, or TraceRequest (one-turn agents of a trace)
    arrivals_s: tuple[float, ...]  # one per agent, simulated seconds
    stats: dict[str, Any]  # the result's `workload` block


def load_workload(cfg: SimConfig, replay: TraceReplay = TraceReplay()) -> Workload:
    """The run's agents, arrivals and statistics from the workload config (module docstring)."""
    from ..workloads import WorkloadFormat, detect_format, trajectory_stats

    path = cfg.workload.trajectory_file
    if path and detect_format(path) is WorkloadFormat.MOONCAKE:
        return load_trace(cfg, replay)
    trajs, arrivals = load_trajectories(cfg)
    return Workload(tuple(trajs), tuple(arrivals), trajectory_stats(trajs, cfg.cluster.block_tokens))


def load_trace(cfg: SimConfig, replay: TraceReplay) -> Workload:
    """A Mooncake trace's requests as `run_trace` picks them, arriving at their scaled timestamps."""
    from ..workloads import mooncake_stats, read_mooncake

    w = cfg.workload
    path = w.trajectory_file
    assert path is not None
    if w.arrival_aps is not None:
        raise InputError("--aps is for trajectories: a Mooncake trace's requests arrive at their timestamps "
                         "(scale them with --time-scale)")
    if w.append_scale != 1.0 or w.gen_scale != 1.0 or w.tool_time_median_s:
        raise InputError("--append-scale, --gen-scale and --tool-time are for agents (trajectories, an agentic trace), "
                         "not a Mooncake trace of requests")
    recs = [r for r in read_mooncake(path) if r.input_tokens + r.output_tokens <= w.max_len_tokens][: replay.limit]
    if not recs:
        raise InputError(f"{path}: no request fits --max-len {w.max_len_tokens} (input + output tokens)")
    first_s = min(r.timestamp_s for r in recs)
    arrivals = tuple((r.timestamp_s - first_s) * replay.time_scale for r in recs)
    stats = {**mooncake_stats(recs, cfg.cluster.block_tokens), "time_scale": replay.time_scale, "limit": replay.limit}
    return Workload(tuple(TraceRequest.of(r) for r in recs), arrivals, stats)


def load_trajectories(cfg: SimConfig) -> tuple[tuple[Any, ...], tuple[float, ...]]:
    """Trajectories and arrival times (seconds) for the workload config."""
    from ..workloads import generate, offline_arrivals, poisson_arrivals, read_agents
    from ..workloads.sample import one_unit_share
    from ..workloads.tool_time import with_tool_times

    w = cfg.workload
    if w.trajectory_file:
        trajs = read_agents(w.trajectory_file)
        if len(trajs) < w.num_agents:
            raise InputError(f"{w.trajectory_file} holds {len(trajs)} trajectories, fewer than --agents {w.num_agents}")
        trajs = tuple(t.truncate(w.max_len_tokens) for t in trajs[: w.num_agents])
    else:
        trajs = generate(w.max_len_tokens, w.num_agents * w.unit_of, w.seed, append_scale=w.append_scale,
                         gen_scale=w.gen_scale)
        trajs = one_unit_share(trajs, w.unit_of)
    trajs = with_tool_times(trajs, w.tool_time_median_s, w.tool_time_sigma, w.seed)
    if w.arrival_aps is None:
        arrivals = offline_arrivals(len(trajs))
    else:
        arrivals = poisson_arrivals(len(trajs), w.arrival_aps, w.seed)
    # an agent whose file fixes its start keeps it (trajectory JSONL `arrival_s`, an agentic trace's timestamps)
    return trajs, tuple(a if t.arrival_s is None else t.arrival_s for t, a in zip(trajs, arrivals))


def run_modes(cfg: SimConfig, modes: Sequence[str], progress: Progress | None = None,
              turns_csv: str | Path | None = None, replay: TraceReplay = TraceReplay(),
              decisions: str | Path | None = None, timeline: str | Path | None = None,
              on_loaded: Callable[[], None] | None = None) -> dict[str, Any]:
    """One simulation per mode on the same workload; `turns_csv` also writes every finished turn
    of every mode (TurnRecorder.write_csv); `decisions`, every scheduling decision of each mode
    (metrics/decisions.py: decisions_path); `timeline`, each mode's spans as a Chrome trace
    (metrics/timeline.py: timeline_path); `replay` applies to a Mooncake trace; `on_loaded` is
    called once the workload is loaded and checked, before the first simulation."""
    from ..metrics.decisions import DecisionLog, decisions_path, write_jsonl
    from ..metrics.timeline import NULL_TIMELINE, Timeline, timeline_path, write_trace

    features = [(m, parse_mode(m)) for m in modes]
    work = load_workload(cfg, replay)
    if on_loaded is not None:
        on_loaded()
    runs = []
    for i, (name, feat) in enumerate(features):
        sim = Simulator(cfg, feat, work.agents, work.arrivals_s, NULL_TIMELINE if timeline is None else Timeline())
        if decisions is not None:
            sim.driver.decisions = DecisionLog()
        cb = None if progress is None else (lambda done, total, _n=name: progress(_n, done, total))
        result = sim.run(progress=cb)
        result["mode"] = name
        runs.append(result)
        if turns_csv is not None:
            sim.recorder.write_csv(turns_csv, name, append=i > 0)
        if sim.driver.decisions is not None:
            result["decisions_file"] = str(write_jsonl(sim.driver.decisions.decisions, decisions_path(decisions, name)))
        if timeline is not None:
            result["timeline_file"] = str(write_trace(sim_trace(sim), timeline_path(timeline, name)))
    return {
        "config": cfg.to_dict(),
        "workload": work.stats,
        "runs": runs,
    }


def sim_trace(sim: Simulator) -> dict[str, Any]:
    """The Chrome trace of a finished run built with `timeline=Timeline()` (metrics/timeline.py)."""
    return sim.ctx.timeline.to_chrome("sim")


def run_mode(cfg: SimConfig, mode: str, replay: TraceReplay = TraceReplay(), with_progress: bool = True,
             bound: RunBound | None = None) -> dict[str, Any]:
    """One mode of `run_modes` on its own (a Ray task of `dualpath sim --ray`): the same result as
    there. `with_progress`: run as `run_modes` does with a progress callback (the simulator's
    loop then runs in chunks and stops a little later, which moves the end-of-run clock);
    `bound`: stop once the run cannot come first (bound.py; `dualpath plan`)."""
    work = load_workload(cfg, replay)
    sim = Simulator(cfg, parse_mode(mode), work.agents, work.arrivals_s)
    result = sim.run(progress=(lambda done, total: None) if with_progress else None, bound=bound)
    result["mode"] = mode
    return result


def _clean(x: Any) -> Any:
    """JSON has no NaN/inf: write null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(result: dict[str, Any], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_clean(result), indent=2, sort_keys=True, default=_default) + "\n")


def _default(o: Any) -> Any:
    if dataclasses.is_dataclass(o):
        return dataclasses.asdict(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def plot_runs(result: dict[str, Any], path: str | Path, title: str = "") -> None:
    from ..metrics.plots import plot_runs as _plot

    _plot(result, path, title)
