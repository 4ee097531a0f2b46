"""TokenBucket: exact rates under a ManualClock, burst cap, unlimited mode."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.runtime.clock import ManualClock
from dualpath.runtime.transport.token_bucket import TokenBucket


def test_backlogged_consumer_gets_exactly_burst_plus_rate_times_time():
    clock = ManualClock()
    bucket = TokenBucket(rate_bytes_per_s=1000.0, burst_bytes=500, clock=clock)
    for _ in range(50):
        bucket.consume(100)  # sleeps advance the manual clock
    # the first 500 bytes ride the burst, the other 4500 take 4.5 s at 1000 B/s
    assert clock.now_s() == pytest.approx(4.5, abs=1e-12)
    assert bucket.granted_bytes == 5000


def test_reserve_returns_the_wait_until_the_debt_is_paid():
    clock = ManualClock()
    bucket = TokenBucket(1024.0, 256, clock)
    assert bucket.reserve(256) == 0.0  # covered by the burst
    assert bucket.reserve(512) == pytest.approx(0.5)  # 512 B of debt at 1024 B/s
    clock.advance(0.25)
    assert bucket.reserve(0) == pytest.approx(0.25)  # half the debt is paid
    clock.advance(10.0)
    assert bucket.reserve(256) == 0.0  # idle refill is capped at the burst ...
    assert bucket.reserve(1) == pytest.approx(1 / 1024)  # ... so the next byte waits


def test_zero_burst_serialises_like_a_link():
    clock = ManualClock()
    bucket = TokenBucket(2048.0, 0, clock)
    assert bucket.reserve(1024, at_s=0.0) == pytest.approx(0.5)
    assert bucket.reserve(1024, at_s=0.5) == pytest.approx(0.5)
    assert bucket.reserve(1024, at_s=0.75) == pytest.approx(0.75)  # still 0.25 s of the last one left


def test_unlimited_never_waits():
    clock = ManualClock()
    bucket = TokenBucket(None, 0, clock)
    for n in (1, 10**9, 10**12):
        bucket.consume(n)
    assert clock.now_s() == 0.0
    assert bucket.unlimited


def test_rejects_bad_configs_and_time_running_backwards():
    clock = ManualClock(start_s=5.0)
    with pytest.raises(ValueError):
        TokenBucket(0.0, 10, clock)
    with pytest.raises(ValueError):
        TokenBucket(10.0, -1, clock)
    bucket = TokenBucket(10.0, 10, clock)
    with pytest.raises(ValueError):
        bucket.reserve(1, at_s=4.0)


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=40), burst=st.integers(0, 4096),
       idles=st.lists(st.sampled_from([0.0, 0.125, 2.0]), min_size=40, max_size=40))
def test_never_more_than_burst_plus_rate_times_time(sizes, burst, idles):
    rate = 1024.0
    clock = ManualClock()
    bucket = TokenBucket(rate, burst, clock)
    for n, idle in zip(sizes, idles):
        clock.advance(idle)
        bucket.consume(n)
        # once consume returns, the bytes granted so far were all paid for
        assert bucket.granted_bytes <= burst + rate * clock.now_s() + 1e-6
        bucket.check_invariants()
