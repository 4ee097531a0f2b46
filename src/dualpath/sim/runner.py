"""Run the simulator for a config and a list of modes; JSON result and a plot.

JSON layout (the runtime's `dualpath demo` writes the same keys): `config` (the resolved config
tree), `workload` (its Table-2 statistics), `runs` (one object per mode; see results.py).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import SimConfig, parse_mode
from ..errors import InputError
from .simulator import Simulator

Progress = Callable[[str, int, int], None]


def load_trajectories(cfg: SimConfig) -> tuple[tuple[Any, ...], tuple[float, ...]]:
    """Trajectories and arrival times (seconds) for the workload config."""
    from ..workloads import generate, offline_arrivals, poisson_arrivals, read_trajectories

    w = cfg.workload
    if w.trajectory_file:
        trajs = read_trajectories(w.trajectory_file)
        if len(trajs) < w.num_agents:
            raise InputError(f"{w.trajectory_file} holds {len(trajs)} trajectories, fewer than --agents {w.num_agents}")
        trajs = tuple(t.truncate(w.max_len_tokens) for t in trajs[: w.num_agents])
    else:
        trajs = generate(w.max_len_tokens, w.num_agents, w.seed, append_scale=w.append_scale, gen_scale=w.gen_scale)
    if w.arrival_aps is None:
        arrivals = offline_arrivals(len(trajs))
    else:
        arrivals = poisson_arrivals(len(trajs), w.arrival_aps, w.seed)
    return trajs, arrivals


def run_modes(cfg: SimConfig, modes: Sequence[str], progress: Progress | None = None,
              turns_csv: str | Path | None = None) -> dict[str, Any]:
    """One simulation per mode on the same workload; `turns_csv` also writes every finished turn
    of every mode (TurnRecorder.write_csv)."""
    from ..workloads import trajectory_stats

    features = [(m, parse_mode(m)) for m in modes]
    trajs, arrivals = load_trajectories(cfg)
    runs = []
    for i, (name, feat) in enumerate(features):
        sim = Simulator(cfg, feat, trajs, arrivals)
        cb = None if progress is None else (lambda done, total, _n=name: progress(_n, done, total))
        result = sim.run(progress=cb)
        result["mode"] = name
        runs.append(result)
        if turns_csv is not None:
            sim.recorder.write_csv(turns_csv, name, append=i > 0)
    return {
        "config": cfg.to_dict(),
        "workload": trajectory_stats(trajs, cfg.cluster.block_tokens),
        "runs": runs,
    }


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
