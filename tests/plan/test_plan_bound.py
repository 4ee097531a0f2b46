"""The planner's branch and bound (plan/search.py step 5), on a workload whose simulations are
scripted: the first batch runs unbounded, each later batch carries the best result before it,
a configuration past that bound is listed as outranked, never ranked, and the first choice is the
one the search finds with every simulation run to its end."""

from __future__ import annotations

import dataclasses

import pytest

from dualpath.experiments.common import Context
from dualpath.plan.search import PlanRequest, _bound, make_plan
from dualpath.plan.workload import Generated


@dataclasses.dataclass(frozen=True)
class Scripted(Generated):
    """The generator's agents for the estimates; each simulation's JCT and TTFT p99 from the
    configuration (more prefill nodes: slower; basic slowest), and a bound applied as the
    simulator applies it: a run past it stops (sim/bound.py)."""

    obey_bounds: bool = True

    def simulate(self, ctx, model, configs, bound=None):
        out = []
        for shape, mode, _load in configs:
            jct = 100.0 * (1 + 0.1 * shape.num_prefill_nodes) * (2.0 if mode.startswith("basic") else 1.0)
            jct *= 1.03 if "split" in mode else 1.0
            ttft_p99 = jct / 50
            CALLS.append((shape.pd, mode, bound))
            if self.obey_bounds and bound is not None and jct > bound.jct_s and (
                    bound.ttft_p99_s is None or ttft_p99 > bound.ttft_p99_s):
                out.append({"stopped": {"jct_above_s": bound.jct_s * 1.001, "bound_jct_s": bound.jct_s,
                                        "bound_ttft_p99_s": bound.ttft_p99_s}, "wall_s": 0.0})
                continue
            out.append({"jct_s": jct, "ttft_s": {"p50": ttft_p99 / 3, "p99": ttft_p99}, "tpot_s": {"mean": 0.02},
                        "nic_utilisation": {"snic_read_by_node": [0.5] * 16, "cnic_max": 0.1},
                        "gpu_busy": {"prefill_mean": 0.5, "decode_mean": 0.5}})
        return out


CALLS: list = []


def _plan(tmp_path, obey=True, **kw):
    CALLS.clear()
    wl = Scripted(32768, 64, 1, obey_bounds=obey)
    return make_plan(PlanRequest("ds-27b", 64, wl, confirm=2, **kw), Context(tmp_path, seed=1, use_disk_cache=False))


@pytest.mark.parametrize("slo", [{}, {"slo_ttft_p99_s": 0.5}])
def test_later_batches_stop_at_the_best_before_them_and_the_first_choice_is_unchanged(tmp_path, slo):
    plan = _plan(tmp_path, **slo)
    calls = list(CALLS)
    full = _plan(tmp_path, obey=False, **slo)
    assert [c[:2] for c in calls] == [c[:2] for c in CALLS]  # the same configurations, in the same order
    assert all(b is None for _, _, b in calls[:2])  # the first batch: no bound
    assert any(b is not None for _, _, b in calls[2:])
    assert plan.outranked, "a basic configuration at twice the JCT must stop"
    best = plan.ranked[0]
    assert (best.estimate.shape.pd, best.estimate.mode) == (full.ranked[0].estimate.shape.pd, full.ranked[0].estimate.mode)
    by_full = {(c.estimate.shape.pd, c.estimate.mode): c for c in full.ranked}
    for o in plan.outranked:  # each ranks below the first choice when run to its end
        whole = by_full[(o.estimate.shape.pd, o.estimate.mode)]
        assert whole.predicted["jct_s"] > o.bound_jct_s >= best.predicted["jct_s"]
        assert o.misses_ttft == bool(slo)
    ranked = {(c.estimate.shape.pd, c.estimate.mode) for c in plan.ranked}
    assert ranked.isdisjoint((o.estimate.shape.pd, o.estimate.mode) for o in plan.outranked)
    assert len(plan.ranked) + len(plan.outranked) == len(full.ranked)


def test_the_bound_is_what_a_later_result_must_beat(tmp_path):
    plan = _plan(tmp_path)
    best = plan.ranked[0]
    req = plan.request
    assert _bound(req, best).jct_s == best.predicted["jct_s"] and _bound(req, best).ttft_p99_s is None
    missed = dataclasses.replace(best, meets_slo=False)
    with_ttft = dataclasses.replace(req, slo_ttft_p99_s=1.0)
    assert _bound(with_ttft, missed).ttft_p99_s == 1.0  # meeting the TTFT SLO would still rank first
    assert _bound(dataclasses.replace(req, slo_tpot_s=0.01), missed) is None  # a mean TPOT can still come down
    online = dataclasses.replace(with_ttft, workload=Scripted(32768, 64, 1, aps=1.0), objective="goodput")
    assert _bound(online, best) is None  # the goodput search runs each load to its end


def test_no_bound_runs_every_simulation_to_its_end(tmp_path):
    CALLS.clear()
    wl = Scripted(32768, 64, 1)
    plan = make_plan(PlanRequest("ds-27b", 64, wl, confirm=2, bound=False), Context(tmp_path, seed=1, use_disk_cache=False))
    assert CALLS and all(b is None for _, _, b in CALLS) and not plan.outranked
    assert len(plan.ranked) == len(CALLS)
