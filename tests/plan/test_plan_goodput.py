"""The goodput search: it brackets the highest load that meets the SLOs to within its tolerance,
in lock step over configurations, and reports the run at that load."""

import pytest

from dualpath.plan import goodput
from dualpath.plan.analytic import Estimate
from dualpath.plan.space import Shape


def _estimate(pd_p, busy):
    return Estimate(Shape(pd_p, 2, pd_p, 2), "dualpath", busy, max(busy.values()), "x", None)


def test_the_search_brackets_each_configurations_limit_in_lock_step():
    limits = {1: 3.3, 2: 0.2, 3: 100.0}  # P -> the highest load meeting the SLOs
    estimates = [_estimate(p, {"arrivals": 100.0, "PE SNIC": 50.0}) for p in limits]  # start at load 2
    rounds = []

    def simulate(batch):
        rounds.append(len(batch))
        return [{"p": e.shape.num_prefill_nodes, "load": f} for e, f in batch]

    searches = goodput.search(estimates, simulate, lambda run: run["load"] <= limits[run["p"]])
    by_p = {s.estimate.shape.num_prefill_nodes: s for s in searches}
    assert by_p[1].met <= 3.3 < by_p[1].missed and by_p[1].missed / by_p[1].met <= 1 + goodput.TOLERANCE
    assert by_p[2].met <= 0.2 < by_p[2].missed and by_p[2].missed / by_p[2].met <= 1 + goodput.TOLERANCE
    assert by_p[3].met == goodput.MAX_LOAD and by_p[3].missed is None  # never missed: capped, said as such
    assert all(s.history[0][0] == 2.0 for s in searches)  # each started at its saturating load
    assert by_p[1].reported == (by_p[1].met, {"p": 1, "load": by_p[1].met})
    assert sum(rounds) == sum(s.runs for s in searches) and rounds == sorted(rounds, reverse=True)


def test_a_configuration_that_never_meets_the_slos_reports_its_lowest_load():
    s = goodput.search([_estimate(1, {"arrivals": 10.0, "PE SNIC": 10.0})], lambda b: [{"f": f} for _, f in b],
                       lambda run: False)[0]
    assert s.met is None and s.missed == pytest.approx(goodput.MIN_LOAD) and s.reported[0] == s.missed


def test_the_search_starts_where_the_busiest_resource_saturates():
    assert goodput.saturating_load(_estimate(1, {"arrivals": 100.0, "PE SNIC": 25.0, "agent chain": 500.0})) == 4.0
    assert goodput.saturating_load(_estimate(1, {"PE SNIC": 25.0})) == 1.0  # offline: no arrival span
    assert goodput.saturating_load(_estimate(1, {"arrivals": 1e6, "PE SNIC": 1.0})) == goodput.MAX_LOAD
