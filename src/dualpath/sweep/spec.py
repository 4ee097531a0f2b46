"""The sweep spec: a YAML mapping of grid axes, each a value or a list of values.

    model: ds-27b              # a model preset (costmodel/models.py)
    pd: [1P1D, 1P2D]           # P/D shapes (default: the paper's for the model)
    max_len: [32k, 64k]        # trajectory MaxLen
    agents: [16, 32]           # agents per run (offline: all arrive at t = 0)
    mode: [basic, dualpath]    # config.parse_mode
    seed: [1, 2]               # workload seeds (default 1)
    tool_time: [0, 5]          # median tool time between an agent's rounds, s (default 0; workloads/tool_time.py)

Every key is checked before anything runs: an unknown key, a missing one, an empty list or a bad
value is an InputError naming the file, the key and the value (the CLI: one line, exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any, Callable

from ..config import paper_cluster, parse_mode, parse_pd
from ..parsing import parse_tokens
from ..errors import InputError
from ..experiments.simrun import SimSpec

REQUIRED = ("model", "max_len", "agents", "mode")
OPTIONAL = ("pd", "seed", "tool_time")
MAX_RUNS = 10_000  # project choice: a grid larger than this is almost surely a typo in a list


@dataclass(frozen=True, slots=True)
class SweepPoint:
    spec: SimSpec
    seed: int


@dataclass(frozen=True, slots=True)
class SweepSpec:
    models: tuple[str, ...]
    pds: tuple[str | None, ...]  # None: the paper's shape for the model
    max_lens_tokens: tuple[int, ...]
    agents: tuple[int, ...]
    modes: tuple[str, ...]
    seeds: tuple[int, ...]
    tool_times_s: tuple[float, ...] = (0.0,)

    def points(self) -> list[SweepPoint]:
        """The grid in axis order (model, P/D, MaxLen, agents, tool time, mode, seed), last axis fastest."""
        out = []
        for model, pd, max_len, n, tool_s, mode, seed in product(self.models, self.pds, self.max_lens_tokens, self.agents,
                                                                 self.tool_times_s, self.modes, self.seeds):
            shape = pd or paper_cluster(model).pd
            out.append(SweepPoint(SimSpec(model, shape, max_len, n, mode, tool_time_s=tool_s), seed))
        return out


def load_spec(path: Path) -> SweepSpec:
    """Read and validate SPEC (module docstring)."""
    import yaml

    if not path.is_file():
        raise InputError(f"sweep spec not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise InputError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    return parse_spec(data, str(path))


def parse_spec(data: Any, where: str = "sweep spec") -> SweepSpec:
    if not isinstance(data, dict):
        raise InputError(f"{where}: expected a mapping of {', '.join(REQUIRED + OPTIONAL)}, got {type(data).__name__}")
    unknown = sorted(str(k) for k in data if k not in REQUIRED + OPTIONAL)
    if unknown:
        raise InputError(f"{where}: unknown key {', '.join(map(repr, unknown))}; known: {', '.join(REQUIRED + OPTIONAL)}")
    missing = [k for k in REQUIRED if k not in data]
    if missing:
        raise InputError(f"{where}: missing key {', '.join(map(repr, missing))}")
    spec = SweepSpec(
        models=_axis(data, "model", where, _model),
        pds=_axis(data, "pd", where, _pd) if data.get("pd") is not None else (None,),
        max_lens_tokens=_axis(data, "max_len", where, parse_tokens),
        agents=_axis(data, "agents", where, _positive_int),
        modes=_axis(data, "mode", where, _mode),
        seeds=_axis(data, "seed", where, _seed) if "seed" in data else (1,),
        tool_times_s=_axis(data, "tool_time", where, _seconds) if "tool_time" in data else (0.0,),
    )
    num_runs = (len(spec.models) * len(spec.pds) * len(spec.max_lens_tokens) * len(spec.agents) * len(spec.modes)
                * len(spec.seeds) * len(spec.tool_times_s))
    if num_runs > MAX_RUNS:
        raise InputError(f"{where}: the grid has {num_runs:,} runs, more than {MAX_RUNS:,}")
    return spec


def _axis(data: dict, key: str, where: str, check: Callable[[Any], Any]) -> tuple[Any, ...]:
    raw = data[key]
    values = raw if isinstance(raw, list) else [raw]
    if not values:
        raise InputError(f"{where}: {key} is an empty list")
    out = []
    for v in values:
        if isinstance(v, (dict, list)) or v is None:
            raise InputError(f"{where}: {key}: expected a value or a list of values, got {v!r}")
        try:
            out.append(check(v))
        except InputError as e:
            raise InputError(f"{where}: {key}: {e}") from None
    if len(set(out)) != len(out):
        raise InputError(f"{where}: {key} lists a value twice: {values!r}")
    return tuple(out)


def _model(v: Any) -> str:
    paper_cluster(str(v))  # an unknown model is an InputError listing the known ones
    return str(v)


def _pd(v: Any) -> str:
    parse_pd(str(v))
    return str(v)


def _mode(v: Any) -> str:
    parse_mode(str(v))
    return str(v)


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise InputError(f"expected a positive integer, got {v!r}")
    return v


def _seconds(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
        raise InputError(f"expected a finite number of seconds >= 0, got {v!r}")
    return float(v)


def _seed(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise InputError(f"expected an integer >= 0, got {v!r}")
    return v
