"""A run bound (sim/bound.py, `dualpath plan`'s branch and bound): a run that cannot come first
stops, a run that can is untouched, and the TTFT rule stops only a run whose p99 must miss."""

import dataclasses

import numpy as np
import pytest

from dualpath.experiments.simrun import SimSpec, run_spec
from dualpath.metrics.summary import certainly_above
from dualpath.sim.bound import RunBound

# the loop's chunks (the bound is checked between them) of 1,000 events, the ledgers checked at each
SPEC = SimSpec("ds-27b", "1P1D", 32768, 48, "dualpath", knobs=("check_invariants_every=1000",))
SEED = 3


@pytest.fixture(scope="module")
def whole():
    return run_spec(SPEC, SEED)


def _bounded(jct_s, ttft_p99_s=None):
    return run_spec(dataclasses.replace(SPEC, bound=RunBound(jct_s, ttft_p99_s)), SEED)


def _same_but_wall(a, b):
    strip = lambda r: {k: v for k, v in r.items() if k not in ("wall_s", "turns_per_wall_s", "policy_wall_s", "spec")}  # noqa: E731
    return strip(a) == strip(b)


@pytest.mark.parametrize("total", [1, 2, 3, 50, 99, 100, 101, 250, 1000])
def test_the_p99_is_certain_to_exceed_a_threshold_exactly_when_numpy_says_so_for_any_other_values(total):
    """The worst case for 'certain': the turns still to come far under the threshold, the known
    ones just over it."""
    for num_above in range(total + 1):
        worst = np.percentile([-1e9] * (total - num_above) + [1e-9] * num_above, 99) > 0.0
        assert certainly_above(num_above, total, 99) == worst


def test_a_run_that_stays_under_its_bound_returns_what_it_returns_without_one(whole):
    assert whole["jct_s"] > 0 and "stopped" not in whole
    assert _same_but_wall(_bounded(whole["jct_s"] * 1.01), whole)
    # a TTFT limit above the run's own p99 never lets it stop, however early the JCT bound
    assert _same_but_wall(_bounded(whole["jct_s"] * 0.3, whole["ttft_s"]["p99"] * 1.01), whole)


def test_a_run_past_its_bound_stops_there_and_reports_a_lower_bound_of_its_jct(whole):
    bound_s = whole["jct_s"] * 0.5
    r = _bounded(bound_s)
    s = r["stopped"]
    assert bound_s < s["jct_above_s"] < whole["jct_s"]
    assert s["bound_jct_s"] == bound_s and s["turns_over_ttft"] is None
    assert 0 < s["turns_done"] < s["turns"] == whole["ttft_s"]["count"]  # the offline run records every turn
    assert "jct_s" not in r and "probe" not in r


def test_with_a_ttft_limit_a_run_stops_only_once_its_p99_must_exceed_it(whole):
    limit_s = whole["ttft_s"]["p99"] * 0.5  # the whole run misses it
    r = _bounded(whole["jct_s"] * 0.3, limit_s)
    s = r["stopped"]
    assert certainly_above(s["turns_over_ttft"], s["turns"], 99)
    assert s["bound_ttft_p99_s"] == limit_s and s["jct_above_s"] > whole["jct_s"] * 0.3


def test_a_bound_is_refused_where_a_run_has_a_horizon_and_must_be_positive():
    with pytest.raises(ValueError, match="positive JCT"):
        RunBound(0.0)
    with pytest.raises(ValueError, match="TTFT p99"):
        RunBound(10.0, -1.0)
    online = dataclasses.replace(SPEC, aps=2.0, horizon_s=20.0, bound=RunBound(5.0))
    with pytest.raises(ValueError, match="no horizon"):
        run_spec(online, SEED)
