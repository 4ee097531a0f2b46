"""Shared pieces of the experiments: the run context, headlines, outputs, markdown and figures.

An experiment module exposes `NAME`, `TITLE` and `run(ctx) -> ExperimentOutput`. It picks its
scale with `ctx.pick(full=..., quick=..., smoke=...)`: `full` is the paper's setting, `quick`
(`dualpath repro --quick`) a reduced one that finishes the whole suite in minutes, `smoke` the
smallest one that still exercises every code path (the tests).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, TypeVar

from ..errors import InputError
from ..pool.executor import Executor, SerialExecutor
from .knobs import hardware_only_knob_names

T = TypeVar("T")
SCALES = ("full", "quick", "smoke")
MODE_LABELS = {"dualpath": "Ours", "basic": "Ours(basic)", "oracle": "Ours(oracle)"}
MODE_COLORS = {"dualpath": "#c44e52", "basic": "#4c72b0", "oracle": "#55a868",
               "basic+layerwise": "#8172b2", "basic+layerwise+de_read": "#ccb974"}


class ProgressSink(Protocol):
    def start_experiment(self, name: str) -> None: ...
    def end_experiment(self, name: str, wall_s: float) -> None: ...
    def start_sim(self, label: str, total: int) -> Any: ...
    def update_sim(self, task: Any, done: int, total: int) -> None: ...
    def end_sim(self, task: Any) -> None: ...
    def cached(self, label: str) -> None: ...
    # a simulation run elsewhere (a Ray task) has finished: `num_done` of the batch's `num_total`
    def sim_finished(self, label: str, wall_s: float, num_done: int, num_total: int) -> None: ...


class NullProgress:
    def start_experiment(self, name: str) -> None:
        pass

    def end_experiment(self, name: str, wall_s: float) -> None:
        pass

    def start_sim(self, label: str, total: int) -> Any:
        return None

    def update_sim(self, task: Any, done: int, total: int) -> None:
        pass

    def end_sim(self, task: Any) -> None:
        pass

    def cached(self, label: str) -> None:
        pass

    def sim_finished(self, label: str, wall_s: float, num_done: int, num_total: int) -> None:
        pass


@dataclass
class Context:
    out_dir: Path
    scale: str = "full"
    seed: int = 1
    progress: ProgressSink = field(default_factory=NullProgress)
    use_disk_cache: bool = True
    memo: dict[str, Any] = field(default_factory=dict)  # simulation results by cache key
    # The current experiment's simulations (cache key -> wall seconds when first simulated);
    # the suite resets it per experiment, so a cached rerun still reports the simulation cost.
    sim_wall_s: dict[str, float] = field(default_factory=dict)
    sim_build: dict[str, str] = field(default_factory=dict)  # cache key -> "pure" | "compiled" (that run's build)
    # where batches of simulations run (experiments/batch.py); serial: each where it is asked for
    executor: Executor = field(default_factory=SerialExecutor)

    def __post_init__(self) -> None:
        if self.scale not in SCALES:
            raise InputError(f"unknown scale {self.scale!r}: use one of {', '.join(SCALES)}")
        if self.seed < 0:
            raise InputError(f"--seed must be >= 0, got {self.seed}")
        self.out_dir = Path(self.out_dir)

    @property
    def quick(self) -> bool:
        return self.scale != "full"

    def pick(self, full: T, quick: T, smoke: T | None = None) -> T:
        if self.scale == "full":
            return full
        if self.scale == "smoke" and smoke is not None:
            return smoke
        return quick


# What a headline's `ours` is. simulated: computed from simulations (`Headline.runs`) and compared
# with the paper; arithmetic: a closed-form check without simulation (Table 1's cost model);
# derived: computed from other headlines (a mean of two), so never an agreement of its own.
EVIDENCE = ("simulated", "arithmetic", "derived")


@dataclass(frozen=True, slots=True)
class Headline:
    """One number of the paper against ours. `target` is the tolerance: relative (|ours/paper - 1|)
    unless `kind` is "points" (|ours - paper| in percentage points) or "max" (ours <= paper).

    A headline that depends on knobs fitted to the paper's own data names those with a
    hardware-only estimate (`fitted`) and carries ours with each at that estimate (`hardware_only`;
    None: not simulated, `note` says why). One met by construction says why (`by_construction`):
    the report lists it apart and does not count it as agreement with the paper.

    `evidence` says what `ours` is (EVIDENCE) and `runs` which simulations it is computed from
    (`SimSpec.run_id`), so the report can count independent agreements (suite.py:
    `independent_agreements`): two headlines on the same simulations are one agreement."""

    experiment: str
    metric: str
    ours: float | None
    paper: float
    target: float
    kind: str = "relative"
    source: str = "[P]"  # provenance of the paper's number (docs/paper.md tags)
    note: str = ""
    fitted: tuple[str, ...] = ()  # fitted knobs with a hardware-only estimate (knobs.py) this number depends on
    hardware_only: float | None = None  # ours with every fitted knob at its hardware-only estimate
    by_construction: str = ""  # why the agreement holds by construction; "" = it tests the simulator
    evidence: str = "simulated"  # a key of EVIDENCE
    runs: frozenset[str] = frozenset()  # run ids (`SimSpec.run_id`) `ours` is computed from; none for arithmetic

    def __post_init__(self) -> None:
        if self.evidence not in EVIDENCE:
            raise ValueError(f"evidence {self.evidence!r}: use one of {', '.join(EVIDENCE)}")
        if self.evidence == "arithmetic" and self.runs:
            raise ValueError(f"{self.metric}: an arithmetic check rests on no simulation")

    @property
    def rel_error(self) -> float | None:
        return self._rel(self.ours)

    @property
    def met(self) -> bool:
        return self._meets(self.ours)

    @property
    def counted(self) -> bool:
        """Counted in "N of M headlines met": not met by construction."""
        return not self.by_construction

    @property
    def hardware_only_rel_error(self) -> float | None:
        return self._rel(self.hardware_only)

    @property
    def hardware_only_met(self) -> bool | None:
        """Whether the hardware-only value meets the target; None where there is none."""
        return None if self.hardware_only is None else self._meets(self.hardware_only)

    def _rel(self, value: float | None) -> float | None:
        if value is None or not math.isfinite(value) or self.paper == 0:
            return None
        return value / self.paper - 1

    def _meets(self, value: float | None) -> bool:
        if value is None or not math.isfinite(value):
            return False
        if self.kind == "points":
            return abs(value - self.paper) <= self.target
        if self.kind == "max":
            return value <= self.paper
        rel = self._rel(value)
        return rel is not None and abs(rel) <= self.target

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rel_error"] = self.rel_error
        d["met"] = self.met
        d["hardware_only_rel_error"] = self.hardware_only_rel_error
        d["hardware_only_met"] = self.hardware_only_met
        d["runs"] = sorted(self.runs)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Headline":
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        kw["fitted"] = tuple(kw.get("fitted", ()))
        kw["runs"] = frozenset(kw.get("runs", ()))  # JSON written before runs were recorded: none
        return cls(**kw)


def with_hardware_only(headlines: Sequence[Headline], alternative: Sequence[Headline], why_missing: str = "") -> list[Headline]:
    """`headlines` with the fitted knobs named and their hardware-only values taken from
    `alternative` (the same headlines computed from runs with every fitted knob at its hardware-only
    estimate, `simrun.hardware_only`), matched by metric. Headlines met by construction are left
    alone; one without an alternative gets `why_missing` added to its note."""
    alt = {h.metric: h.ours for h in alternative}
    out = []
    for h in headlines:
        if h.by_construction:
            out.append(h)
            continue
        value = alt.get(h.metric)
        note = h.note if value is not None or not why_missing else "; ".join(p for p in (h.note, why_missing) if p)
        out.append(replace(h, fitted=hardware_only_knob_names(), hardware_only=value, note=note))
    return out


@dataclass
class ExperimentOutput:
    name: str
    title: str
    table: list[dict[str, Any]]
    headlines: list[Headline]
    figures: list[str]
    markdown: str  # the body of this experiment's report section (below its heading)
    extra: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0
    sim_wall_s: float = 0.0  # its simulations' wall time when first simulated (cached or not now)
    num_sims: int = 0
    sim_builds: list[str] = field(default_factory=list)  # the builds that ran its simulations (wall times differ)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "title": self.title, "wall_s": self.wall_s, "sim_wall_s": self.sim_wall_s,
            "num_sims": self.num_sims, "sim_builds": self.sim_builds, "table": self.table,
            "headlines": [h.to_dict() for h in self.headlines], "figures": self.figures, **self.extra,
        }


# --- markdown -------------------------------------------------------------------------------
def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if not math.isfinite(x):
            return "-"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        return f"{x:.{digits}g}"
    return str(x)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(fmt(c) for c in row) + " |")
    return "\n".join(lines)


def _error(h: Headline, value: float | None) -> str:
    rel = h._rel(value)
    if h.kind == "points":
        return "-" if value is None or not math.isfinite(value) else f"{value - h.paper:+.1f} pt ({rel:+.0%})"
    return "-" if rel is None else f"{rel:+.1%}"


def _hardware_only_cell(h: Headline) -> str:
    if h.by_construction or not h.fitted:
        return "-"
    if h.hardware_only is None:
        return "no value"
    return f"{fmt(h.hardware_only)} ({_error(h, h.hardware_only)}, {'met' if h.hardware_only_met else 'missed'})"


def headline_table(headlines: Sequence[Headline], counts_as: Sequence[str] | None = None) -> str:
    """One row per headline; `hardware-only`: ours with every fitted knob at its hardware-only
    estimate (its error and result), "-" for a headline that depends on no fitted knob;
    `counts_as`, one per headline, adds a column of that name (the suite's independent agreements)."""
    rows = []
    for i, h in enumerate(headlines):
        tol = f"{h.target:g} pt" if h.kind == "points" else "<= paper" if h.kind == "max" else f"{h.target:.0%}"
        result = "**met**" if h.met else "**missed**"
        rows.append([h.metric, h.ours, f"{fmt(h.paper)} {h.source}", _error(h, h.ours), tol,
                     f"{result} (by construction, not counted)" if h.by_construction else result,
                     _hardware_only_cell(h), *([counts_as[i]] if counts_as is not None else [])])
    headers = ["metric", "ours", "paper", "rel. error", "target", "result", "hardware-only (error, result)"]
    return md_table(headers + (["counts as"] if counts_as is not None else []), rows)


# choice: a goal missed on the run's seed is checked on this many other workloads (`other_seeds`):
# an offline batch's JCT is its slowest agent's finish, so a ratio within a few percent of a goal's
# line on one workload can be that agent's, not the policy's
RECHECK_SEEDS = 4


def other_seeds(ctx: Context, n: int = RECHECK_SEEDS) -> list[Context]:
    """`ctx` on the n seeds after its own (its memo and caches shared: each run is keyed by its seed)."""
    return [replace(ctx, seed=seed) for seed in range(ctx.seed + 1, ctx.seed + 1 + n)]


def scale_note(ctx: Context) -> str:
    if ctx.scale == "full":
        return ""
    return (f"*Reduced scale (`{ctx.scale}`): agent counts, horizons and grids are smaller than the paper's, "
            "so the numbers below are not comparable with the paper's; run without `--quick` for those.*\n\n")


# --- figures --------------------------------------------------------------------------------
def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, ctx: Context, filename: str) -> str:
    path = ctx.out_dir / filename
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return filename


def grouped_bars(ax: Any, groups: Sequence[str], series: dict[str, Sequence[float]], colors: dict[str, str] | None = None,
                 labels: dict[str, str] | None = None) -> None:
    n = max(1, len(series))
    width = 0.8 / n
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        vals = [v if v is not None and math.isfinite(v) else 0.0 for v in values]
        ax.bar(xs, vals, width=width, label=(labels or {}).get(name, name), color=(colors or {}).get(name))
    ax.set_xticks(range(len(groups)), groups)


def ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or not b or not math.isfinite(a) or not math.isfinite(b):
        return float("nan")
    return a / b


def row_runs(rows: Sequence[dict[str, Any]], modes: Sequence[str] = ("basic", "dualpath")) -> frozenset[str]:
    """The run ids of `modes` in rows that carry them as `runs` (mode -> run id): what a speedup
    (basic / dualpath) or a statistic over those rows is computed from."""
    return frozenset(r["runs"][m] for r in rows for m in modes)


def finite_mean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return sum(vals) / len(vals) if vals else float("nan")


Runner = Callable[[Context], ExperimentOutput]
