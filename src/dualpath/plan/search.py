"""The planner's method: enumerate, estimate, prune, simulate the survivors at unit scale, rank.

1. `space.shapes`: every P x D the budget allows, each with the unit it reduces to.
2. `analytic.estimate` for every shape and mode: busy seconds per resource. A mode that reads
   through the decode engines outside the bottleneck-free range is pruned (its CNIC or DRAM binds
   first, docs/paper.md §1.6); the rest are ordered by their estimates (offline: the JCT; online:
   the resources' work, so the shape that saturates last comes first).
3. The first `confirm` survivors are simulated, with the one scheduler, as `dualpath sim` would run
   them (workload.py: a generated workload at its unit, a trace whole); on Ray with `--ray`. Then
   the best simulated one's neighbours (one prefill node more or less, the other modes) until the
   best has none left unsimulated: the estimates order the start, the simulations climb from it.
4. Ranked by the objective: `jct` (shortest JCT first) or `goodput` (online traffic: the most
   turns per second at the highest load that meets the SLOs, goodput.py; one that misses them at
   every load gets 0). Either way a configuration that meets the SLOs ranks before one that
   misses them.
5. Branch and bound (`jct`): from the second batch on, each simulation carries the best result of
   the batches before it as a bound (sim/bound.py) and stops once it cannot rank above that one:
   past its JCT, and, when the best misses the SLOs, only once its own TTFT p99 must miss them too.
   Such a configuration is listed as `outranked` with the JCT it had passed, not ranked. The
   first choice is the one an unbounded search finds (nothing that stops can rank above a result
   already in hand), and the bounds come from whole batches, so the plan does not depend on how
   many simulations run at once.

Deterministic for a seed: the workload, the estimates and every simulation are.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ..errors import InputError
from ..config import paper_cluster
from ..experiments.common import Context
from ..sim.bound import RunBound
from . import analytic, goodput
from .space import DEFAULT_MODES, configurations, shapes, unit_mode
from .workload import Generated, Trace

OBJECTIVES = ("jct", "goodput")


@dataclass(frozen=True, slots=True)
class PlanRequest:
    model: str
    gpus: int
    workload: Generated | Trace
    modes: tuple[str, ...] = DEFAULT_MODES
    objective: str = "jct"
    slo_ttft_p99_s: float | None = None
    slo_tpot_s: float | None = None
    confirm: int = 4  # survivors simulated first (then the best one's neighbours)
    bound: bool = True  # step 5: later simulations stop once they cannot come first (False: every one to its end)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise InputError(f"--objective must be one of {', '.join(OBJECTIVES)}, got {self.objective!r}")
        if self.confirm < 1:
            raise InputError(f"--confirm must be at least 1, got {self.confirm}")
        for name in ("slo_ttft_p99_s", "slo_tpot_s"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise InputError(f"--{name.replace('_', '-').removesuffix('-s')} must be positive, got {v}")
        if self.objective == "goodput":
            if not self.workload.online:
                raise InputError("--objective goodput is for online traffic (the load a configuration carries within "
                                 "the SLOs): give --aps or --trace; an offline batch plans for --objective jct")
            if self.slo_ttft_p99_s is None and self.slo_tpot_s is None:
                raise InputError("--objective goodput needs an SLO: --slo-ttft-p99 and/or --slo-tpot")


@dataclass(frozen=True, slots=True)
class Choice:
    """One simulated configuration: its estimate (whose shape names the unit simulated) and what the
    simulation predicts."""

    estimate: analytic.Estimate
    predicted: dict[str, float]
    meets_slo: bool
    utilisation: dict[str, float]
    load_factor: float = 1.0  # the load simulated (goodput: the highest that met the SLOs)
    runs: int = 1  # simulations behind it


@dataclass(frozen=True, slots=True)
class Outranked:
    """A configuration whose simulation stopped at its bound (step 5): it ranks below the result
    that set the bound."""

    estimate: analytic.Estimate
    jct_above_s: float  # its JCT is longer than this (where its simulation stopped)
    bound_jct_s: float  # the JCT of the result that set the bound
    misses_ttft: bool  # stopped with its TTFT p99 certain to miss the SLO (the bound's owner missed it too)


@dataclass(frozen=True, slots=True)
class Plan:
    request: PlanRequest
    ranked: list[Choice]
    outranked: list[Outranked]  # stopped at their bound (step 5), in the order simulated
    unconfirmed: list[analytic.Estimate]  # in range, not simulated (ordered by estimate)
    pruned: list[analytic.Estimate]  # outside the bottleneck-free range
    demand: analytic.Demand


def make_plan(req: PlanRequest, ctx: Context) -> Plan:
    wl = req.workload
    cluster = paper_cluster(req.model)
    rows, last_arrival_s = wl.rows(cluster.block_tokens)
    demand = analytic.demand(rows, req.model, last_arrival_s)
    everything = [wl.shape_for(s) for s in shapes(req.model, req.gpus, demand.num_agents)]
    estimates = [analytic.estimate(demand, req.model, s, m) for s, m in configurations(everything, req.modes)]
    pruned = [e for e in estimates if e.out_of_range]
    order = _by_work if wl.online else _by_estimate
    survivors = sorted((e for e in estimates if not e.out_of_range), key=order)
    if not survivors:
        raise InputError(f"every configuration of {req.gpus} GPUs is outside the bottleneck-free range for "
                         f"{', '.join(req.modes)}; add basic to --mode or change --gpus")
    choices: list[Choice] = []
    outranked: list[Outranked] = []
    batch = survivors[: req.confirm]
    while batch:
        bound = _bound(req, rank(choices, req.objective)[0]) if choices else None
        got, stopped = _simulate(req, ctx, demand.num_turns, batch, bound)
        choices += got
        outranked += stopped
        done = {(e.shape.pd, e.mode) for e in [c.estimate for c in choices] + [o.estimate for o in outranked]}
        batch = _neighbours(rank(choices, req.objective)[0], survivors, done)
    rest = [e for e in survivors if (e.shape.pd, e.mode) not in done]
    return Plan(req, rank(choices, req.objective), outranked, rest, pruned, demand)


def _bound(req: PlanRequest, best: Choice) -> RunBound | None:
    """What a later simulation must beat to rank above `best` (step 5): a shorter JCT, or meeting
    SLOs that `best` misses; None where that cannot be told before the end (the goodput objective,
    or a missed TPOT SLO alone: a mean can still come down) or where the request asks for every
    simulation to its end (`--no-bound`)."""
    if req.objective != "jct" or not req.bound:
        return None
    if best.meets_slo:
        return RunBound(best.predicted["jct_s"])
    if req.slo_ttft_p99_s is None:
        return None
    return RunBound(best.predicted["jct_s"], req.slo_ttft_p99_s)


def _simulate(req: PlanRequest, ctx: Context, num_turns: int, batch: list[analytic.Estimate],
              bound: RunBound | None) -> tuple[list[Choice], list[Outranked]]:
    """One batch of configurations: simulated at the given load (`jct`, each stopped at `bound`
    once it cannot come first) or searched for their highest load within the SLOs (`goodput`)."""
    wl = req.workload
    if req.objective == "goodput":
        searches = goodput.search(
            batch, lambda b: wl.simulate(ctx, req.model, [(e.shape, unit_mode(e.shape, e.mode), f) for e, f in b]),
            lambda run: _meets(req, latencies(run)))
        return [_choice(req, num_turns, s.estimate, s.reported[1], s.reported[0], s.runs) for s in searches], []
    results = wl.simulate(ctx, req.model, [(e.shape, unit_mode(e.shape, e.mode), 1.0) for e in batch], bound)
    got, stopped = [], []
    for e, r in zip(batch, results):
        if "stopped" in r:
            s = r["stopped"]
            stopped.append(Outranked(e, s["jct_above_s"], s["bound_jct_s"], s["bound_ttft_p99_s"] is not None))
        else:
            got.append(_choice(req, num_turns, e, r))
    return got, stopped


def _neighbours(best: Choice, survivors: Sequence[analytic.Estimate], seen: set[tuple[str, str]]) -> list[analytic.Estimate]:
    """What the best simulated configuration's neighbours are and no simulation has seen yet (`seen`:
    P/D and mode): its shape one prefill node more or less in the same mode, and its shape in the
    other modes. The search climbs until the best has none left (the simulated JCT or goodput moves
    smoothly with P/D, so a better configuration next to the best estimates is found this way)."""
    b = best.estimate
    return [e for e in survivors if (e.shape.pd, e.mode) not in seen and (
        (e.mode == b.mode and abs(e.shape.num_prefill_nodes - b.shape.num_prefill_nodes) == 1) or e.shape.pd == b.shape.pd)]


def _by_estimate(e: analytic.Estimate) -> tuple:
    """Offline: largest busy time first; a tie goes to the next largest, and so on (two shapes that
    the agent chain binds alike differ in what would bind next); then P/D and mode."""
    return (*sorted(e.busy_s.values(), reverse=True), e.shape.pd, e.mode)


def _by_work(e: analytic.Estimate) -> tuple:
    """Online: the same over the resources' work alone (the arrivals and the agent chain are alike
    for every shape, or a latency floor): the shape that saturates last comes first."""
    work = (v for k, v in e.busy_s.items() if k not in analytic.NOT_CAPACITY)
    return (*sorted(work, reverse=True), e.shape.pd, e.mode)


def latencies(r: dict[str, Any]) -> dict[str, float]:
    """A run's (sim/results.py) metrics as the plan predicts them; goodput 0 until the SLOs are checked."""
    return {"jct_s": r["jct_s"], "ttft_p50_s": r["ttft_s"]["p50"], "ttft_p99_s": r["ttft_s"]["p99"],
            "tpot_s": r["tpot_s"]["mean"], "goodput_rps": 0.0}


def _choice(req: PlanRequest, num_turns: int, e: analytic.Estimate, r: dict[str, Any], load: float = 1.0,
            runs: int = 1) -> Choice:
    """The unit's simulation read as the whole configuration's: its latencies and JCT as they are
    (what a node sees is what the unit's nodes see); goodput, when the SLOs hold, as the workload's
    turns over that JCT (at the load simulated)."""
    predicted = latencies(r)
    meets = _meets(req, predicted)
    if meets and predicted["jct_s"]:
        predicted["goodput_rps"] = num_turns / predicted["jct_s"]
    nic = r["nic_utilisation"]
    p = e.shape.unit_prefill_nodes
    reads = nic["snic_read_by_node"]
    utilisation = {
        "pe_snic": sum(reads[:p]) / p, "de_snic": sum(reads[p:]) / max(1, len(reads) - p),
        "cnic_max": nic["cnic_max"], "pe_gpu_busy": r["gpu_busy"]["prefill_mean"],
        "de_gpu_busy": r["gpu_busy"]["decode_mean"],
    }
    return Choice(e, predicted, meets, utilisation, load, runs)


def _meets(req: PlanRequest, predicted: dict[str, float]) -> bool:
    if req.slo_ttft_p99_s is not None and not predicted["ttft_p99_s"] <= req.slo_ttft_p99_s:
        return False
    return req.slo_tpot_s is None or predicted["tpot_s"] <= req.slo_tpot_s


def rank(choices: Sequence[Choice], objective: str) -> list[Choice]:
    """Best first: those meeting the SLOs first; then shortest JCT (`jct`) or most goodput (`goodput`,
    JCT breaking ties); then P/D and mode, so equal numbers keep one order."""
    def key(c: Choice) -> tuple:
        primary = c.predicted["jct_s"] if objective == "jct" else -c.predicted["goodput_rps"]
        return (not c.meets_slo, primary, c.predicted["jct_s"], c.estimate.shape.pd, c.estimate.mode)
    return sorted(choices, key=key)
