import math

import numpy as np
import pytest

from dualpath.errors import InputError
from dualpath.workloads.arrivals import offline_arrivals, poisson_arrivals


def test_offline_all_at_zero():
    assert offline_arrivals(3) == (0.0, 0.0, 0.0)


def test_poisson_mean_gap_and_monotone():
    times = poisson_arrivals(20_000, 2.0, seed=5)
    assert len(times) == 20_000
    gaps = np.diff((0.0,) + times)
    assert times[0] > 0.0
    assert (gaps >= 0).all()
    # Mean gap 1 / rate = 0.5 s; the standard error at n = 20,000 is 0.7%.
    assert abs(gaps.mean() - 0.5) / 0.5 < 0.03
    # Exponential gaps: standard deviation equals the mean.
    assert abs(gaps.std() - 0.5) / 0.5 < 0.05


def test_poisson_deterministic_per_seed():
    assert poisson_arrivals(50, 0.45, seed=1) == poisson_arrivals(50, 0.45, seed=1)
    assert poisson_arrivals(50, 0.45, seed=1) != poisson_arrivals(50, 0.45, seed=2)
    # The first agents' times do not depend on how many agents follow.
    assert poisson_arrivals(10, 0.45, seed=1) == poisson_arrivals(50, 0.45, seed=1)[:10]


@pytest.mark.parametrize("rate", [0, -1.0, math.nan, math.inf, "1", True])
def test_poisson_bad_rate(rate):
    with pytest.raises(InputError, match="agents_per_s"):
        poisson_arrivals(10, rate, seed=0)


@pytest.mark.parametrize("n", [0, -3, 2.5, True])
def test_bad_num_agents(n):
    with pytest.raises(InputError, match="num_agents"):
        offline_arrivals(n)
    with pytest.raises(InputError, match="num_agents"):
        poisson_arrivals(n, 1.0, seed=0)


def test_bad_seed():
    with pytest.raises(InputError, match="seed"):
        poisson_arrivals(10, 1.0, seed=-1)
