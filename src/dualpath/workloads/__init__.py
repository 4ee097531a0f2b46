"""Workloads: agent trajectories (generated or read from JSONL), Mooncake traces, arrivals, stats.

Module map: `trajectory` (one agent's rounds), `jsonl_format` (our trajectory file format),
`generator` (Table 2-calibrated synthetic trajectories), `agentic` (agentic Mooncake traces:
sessions with tool time), `tool_time` (tool time for generated agents), `calibration` (check and refit, run as
`python -m dualpath.workloads.calibration`), `mooncake` (trace loader, block rechunking,
conversation inference), `arrivals` (offline and Poisson), `stats` (Table 2 style statistics).
`MOONCAKE_SLICE`: the first 10 minutes of the Mooncake conversation trace, shipped with the
package (data/README.md: origin, license, what was cut).
"""

from pathlib import Path

from dualpath.workloads.agentic import read_agentic, read_agents
from dualpath.workloads.arrivals import offline_arrivals, poisson_arrivals
from dualpath.workloads.generator import CALIBRATED, GeneratorParams, generate, params_for
from dualpath.workloads.jsonl_format import read_trajectories, write_trajectories
from dualpath.workloads.mooncake import (
    MooncakeRecord,
    Rechunker,
    infer_parents,
    read_mooncake,
    rechunk,
    rescale,
)
from dualpath.workloads.stats import (
    WorkloadFormat,
    detect_format,
    load_any,
    mooncake_stats,
    trajectory_stats,
    workload_stats,
)
from dualpath.workloads.trajectory import Trajectory

MOONCAKE_SLICE = Path(__file__).resolve().parent / "data" / "mooncake_conversation_slice.jsonl"

__all__ = [
    "CALIBRATED",
    "GeneratorParams",
    "MOONCAKE_SLICE",
    "MooncakeRecord",
    "Rechunker",
    "Trajectory",
    "WorkloadFormat",
    "detect_format",
    "generate",
    "infer_parents",
    "load_any",
    "mooncake_stats",
    "offline_arrivals",
    "params_for",
    "poisson_arrivals",
    "read_agentic",
    "read_agents",
    "read_mooncake",
    "read_trajectories",
    "rechunk",
    "rescale",
    "trajectory_stats",
    "workload_stats",
    "write_trajectories",
]
