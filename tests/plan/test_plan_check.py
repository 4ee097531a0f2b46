"""`dualpath bench plan` on a small case: the exhaustive answer covers every configuration at full
scale, the regret and the prediction errors are computed from those runs."""

import pytest

from dualpath.bench.plan_check import Case, cases, check
from dualpath.experiments.common import NullProgress
from dualpath.plan.search import PlanRequest
from dualpath.plan.space import DEFAULT_MODES
from dualpath.plan.workload import Generated


def test_a_small_case_is_checked_against_every_configuration_whole(tmp_path):
    case = Case("small", PlanRequest("ds-27b", 32, Generated(16384, 16, 2), confirm=2))
    c = check(case, tmp_path, NullProgress())
    rows = c["exhaustive"]
    # as deployed: 2P2D, two units, runs each mode with +tail
    assert {(r["pd"], r["mode"]) for r in rows} == {(pd, m) for pd in ("1P3D", "3P1D") for m in DEFAULT_MODES} | {
        ("2P2D", m) for m in ("basic+tail", "dualpath+tail", "dualpath+split+tail")}
    assert [r["jct_s"] for r in rows] == sorted(r["jct_s"] for r in rows)
    first = next(r for r in rows if (r["pd"], r["mode"]) == (c["planner"]["first"]["pd"], c["planner"]["first"]["mode"]))
    assert c["regret"] == pytest.approx(max(0.0, first["jct_s"] / rows[0]["jct_s"] - 1))
    assert c["prediction_error"]["jct_s"] == pytest.approx(c["planner"]["predicted"]["jct_s"] / first["jct_s"] - 1)
    # 2P2D with 16 agents runs as 1P1D with 8: one unit-vs-whole row per mode
    assert [(u["pd"], u["unit_pd"], u["copies"]) for u in c["unit_vs_whole"]] == [("2P2D", "1P1D", 2)] * 3
    assert c["planner"]["simulated"] >= 2 and c["planner"]["wall_s"] > 0
    assert (tmp_path / "cache").is_dir()  # the full-scale runs are kept for a rerun


def test_the_committed_cases_are_well_formed():
    got = cases()
    assert len(got) >= 3 and any(c.online for c in got.values())
    assert all(c.request.objective == ("goodput" if c.online else "jct") for c in got.values())
