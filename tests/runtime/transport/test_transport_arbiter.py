"""LinkArbiter: lane shares, work conservation, one-chunk wait, FIFO baseline, failures, close.

Rate-limited tests run on a blocking ManualClock: everything is submitted at t = 0, then the
clock jumps, so link times are exact and independent of thread timing.
"""

import threading

import numpy as np
import pytest

from dualpath.core.lanes import Lane, LaneWeights
from dualpath.runtime.clock import ManualClock, MonotonicClock
from dualpath.runtime.transport.arbiter import LinkArbiter
from dualpath.runtime.transport.transfer import ArbiterClosed, ContiguousCopy, TransferFailed

LC, KV = Lane.LATENCY_CRITICAL, Lane.KV
CHUNK = 64 * 1024
RATE = CHUNK * 1024.0  # one chunk every 1/1024 s: dyadic, so link times are exact
CHUNK_S = CHUNK / RATE


def noop(offset_bytes, nbytes):
    pass


def manual_link(fifo=False, weights=LaneWeights()):
    clock = ManualClock(blocking=True)
    return clock, LinkArbiter("test", RATE, weights, clock, CHUNK, fifo=fifo, max_lag_s=None)


def wait_sent(arb, total_bytes, timeout_s=10.0):
    """Wait (real time) until the link's thread has copied `total_bytes`."""
    deadline = MonotonicClock().now_s() + timeout_s
    while sum(arb.stats().sent_bytes) < total_bytes:
        assert MonotonicClock().now_s() < deadline, "link thread made no progress"
        threading.Event().wait(0.001)


def test_two_backlogged_lanes_get_99_to_1_of_the_link_by_byte_counters():
    clock, arb = manual_link()
    lc = arb.submit(LC, 30_000 * CHUNK, noop)
    kv = arb.submit(KV, 30_000 * CHUNK, noop)
    clock.advance(20_000 * CHUNK_S)  # both lanes stay backlogged over this window
    wait_sent(arb, 20_000 * CHUNK)
    sent = arb.stats().sent_bytes
    share_kv = sent[KV] / sum(sent)
    assert share_kv == pytest.approx(0.01, rel=0.01)  # 99:1 within 1%
    arb.check_invariants()
    clock.advance(1e6)
    lc.wait(10.0), kv.wait(10.0)
    arb.check_invariants()
    arb.close()


def test_completion_times_follow_the_weighted_schedule():
    clock, arb = manual_link()
    lc = arb.submit(LC, 990 * CHUNK, noop)
    kv = arb.submit(KV, 100 * CHUNK, noop)
    clock.advance(10.0)
    r_lc, r_kv = lc.wait(10.0), kv.wait(10.0)
    # 10 rounds of 99 LC chunks, with one KV chunk after each of the first 9
    assert r_lc.completed_s == pytest.approx(999 * CHUNK_S)
    assert r_kv.completed_s == pytest.approx(1090 * CHUNK_S)  # work conserving: all bytes / rate
    assert r_kv.queue_delay_s == pytest.approx(99 * CHUNK_S)
    stats = arb.stats()
    assert stats.sent_bytes == (990 * CHUNK, 100 * CHUNK)
    assert stats.num_completed == (1, 1)
    assert stats.busy_s == pytest.approx(1090 * CHUNK_S)
    arb.close()


def test_an_idle_latency_critical_lane_leaves_the_whole_link_to_kv():
    clock, arb = manual_link()
    kv = arb.submit(KV, 1000 * CHUNK + 123, noop)
    clock.advance(10.0)
    r = kv.wait(10.0)
    assert r.completed_s == pytest.approx((1000 * CHUNK + 123) / RATE)
    arb.close()


def _lc_behind_kv(fifo):
    clock, arb = manual_link(fifo=fifo)
    kv = arb.submit(KV, 1000 * CHUNK, noop)
    clock.advance(10.5 * CHUNK_S)  # the LC message arrives halfway through KV chunk 10
    lc = arb.submit(LC, CHUNK // 2, noop)
    clock.advance(10.0)
    r = lc.wait(10.0)
    kv.wait(10.0)
    arb.check_invariants()
    arb.close()
    return r


def test_latency_critical_waits_at_most_one_kv_chunk():
    r = _lc_behind_kv(fifo=False)
    assert r.submitted_s == pytest.approx(10.5 * CHUNK_S)
    assert r.queue_delay_s == pytest.approx(0.5 * CHUNK_S)  # the rest of the chunk on the link
    assert r.queue_delay_s <= CHUNK_S


def test_one_fifo_lane_makes_latency_critical_wait_for_the_kv_backlog():
    r = _lc_behind_kv(fifo=True)
    assert r.queue_delay_s == pytest.approx((1000 - 10.5) * CHUNK_S)


def test_unlimited_link_copies_every_byte_once_in_order():
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, 5 * CHUNK + 77, dtype=np.uint8)
    dst = np.zeros_like(src)
    ranges = []

    def do_chunk(offset_bytes, nbytes):
        ranges.append((offset_bytes, nbytes))
        np.copyto(dst[offset_bytes:offset_bytes + nbytes], src[offset_bytes:offset_bytes + nbytes])

    with LinkArbiter("real", None, LaneWeights(), MonotonicClock(), CHUNK) as arb:
        r = arb.submit(KV, src.size, do_chunk).wait(10.0)
        arb.check_invariants()
    assert np.array_equal(src, dst)
    assert ranges == [(i * CHUNK, CHUNK) for i in range(5)] + [(5 * CHUNK, 77)]
    assert r.started_s >= r.submitted_s and r.completed_s >= r.started_s and r.notified_s >= r.completed_s


def test_a_failing_copy_fails_its_transfer_only():
    def boom(offset_bytes, nbytes):
        if offset_bytes + nbytes > 2 * CHUNK:
            raise OSError("disk on fire")

    clock, arb = manual_link()
    bad = arb.submit(KV, 10 * CHUNK, boom)
    good = arb.submit(LC, 3 * CHUNK, noop)
    clock.advance(10.0)
    with pytest.raises(TransferFailed, match="disk on fire"):
        bad.wait(10.0)
    assert good.wait(10.0).nbytes == 3 * CHUNK
    arb.check_invariants()
    arb.close()


def test_close_fails_queued_transfers_joins_the_thread_and_refuses_new_ones():
    before = threading.active_count()
    arb = LinkArbiter("slow", 1e6, LaneWeights(), MonotonicClock(), 4096)
    h = arb.submit(KV, 10**9, noop)  # would take 1000 s
    arb.close()
    with pytest.raises(TransferFailed):
        h.wait(1.0)
    assert threading.active_count() == before
    with pytest.raises(ArbiterClosed):
        arb.submit(KV, 1, noop)
    arb.check_invariants()
    arb.close()  # idempotent


def test_close_with_a_drain_sends_what_is_queued_and_runs_every_callback_first():
    """An engine that stops lets its queued copies land (each callback hands a block to its
    writer), within the drain's bound; what is left after it fails as without one."""
    arb = LinkArbiter("drain", 1e6, LaneWeights(), MonotonicClock(), 4096)
    landed = []

    def slow_callback(result):
        threading.Event().wait(0.05)  # idle only once the callback has returned
        landed.append(result.nbytes)

    handles = [arb.submit(KV, 20_000, noop, on_done=slow_callback) for _ in range(3)]  # ~60 ms at 1 MB/s
    assert not arb.idle()
    arb.close(drain_s=10.0)
    assert landed == [20_000] * 3 and all(h.wait(0).nbytes == 20_000 for h in handles)
    assert arb.idle()
    arb.check_invariants()

    bounded = LinkArbiter("bounded", 1e6, LaneWeights(), MonotonicClock(), 4096)
    h = bounded.submit(KV, 10**9, noop)  # would take 1000 s: the drain gives up after its bound
    t0 = MonotonicClock().now_s()
    bounded.close(drain_s=0.2)
    assert 0.2 <= MonotonicClock().now_s() - t0 < 5.0
    with pytest.raises(TransferFailed):
        h.wait(1.0)
    assert bounded.idle()
    bounded.check_invariants()


def test_on_done_runs_after_completion_with_the_result():
    seen = []
    with LinkArbiter("cb", None, LaneWeights(), MonotonicClock(), CHUNK) as arb:
        h = arb.submit(LC, 10, noop, on_done=seen.append)
        r = h.wait(10.0)
        deadline_s = MonotonicClock().now_s() + 10.0  # the callback runs on the link thread
        while not seen and MonotonicClock().now_s() < deadline_s:
            threading.Event().wait(0.001)
    assert seen == [r]


def test_at_real_speed_a_latency_critical_arrival_cuts_a_kv_run_after_one_chunk():
    calls = []
    in_chunk_2, go = threading.Event(), threading.Event()

    def kv_chunk(offset_bytes, nbytes):
        calls.append(("kv", offset_bytes, nbytes))
        if offset_bytes == 2 * CHUNK:  # the LC message arrives while this chunk is copied
            in_chunk_2.set()
            assert go.wait(10.0)

    def lc_chunk(offset_bytes, nbytes):
        calls.append(("lc", offset_bytes, nbytes))

    with LinkArbiter("real", None, LaneWeights(), MonotonicClock(), CHUNK) as arb:
        kv = arb.submit(KV, 100 * CHUNK, kv_chunk)
        assert in_chunk_2.wait(10.0)
        lc = arb.submit(LC, 2 * CHUNK, lc_chunk)
        arb.check_invariants()
        go.set()
        r_lc, r_kv = lc.wait(10.0), kv.wait(10.0)
        arb.check_invariants()
        assert arb.stats().sent_bytes == (2 * CHUNK, 100 * CHUNK)
    kv_calls = [("kv", i * CHUNK, CHUNK) for i in range(100)]
    assert calls == kv_calls[:3] + [("lc", 0, CHUNK), ("lc", CHUNK, CHUNK)] + kv_calls[3:]
    assert r_lc.completed_s <= r_kv.completed_s


def test_at_real_speed_a_copy_failing_inside_a_run_fails_its_transfer_only():
    def boom(offset_bytes, nbytes):
        if offset_bytes >= 3 * CHUNK:
            raise OSError("disk on fire")

    with LinkArbiter("real", None, LaneWeights(), MonotonicClock(), CHUNK) as arb:
        bad = arb.submit(KV, 10 * CHUNK, boom)
        good = arb.submit(KV, 2 * CHUNK, noop)
        with pytest.raises(TransferFailed, match="disk on fire"):
            bad.wait(10.0)
        assert good.wait(10.0).nbytes == 2 * CHUNK
        arb.check_invariants()
        assert arb.stats().sent_bytes == (0, 5 * CHUNK)  # 3 chunks of the failed one, then the good one


def test_contiguous_copy_moves_ranges_and_rejects_bad_ones():
    src = np.arange(1000, dtype=np.uint8)
    dst = np.zeros_like(src)
    copy = ContiguousCopy(dst, src)
    copy(0, 10)
    copy(990, 10)
    assert np.array_equal(dst[:10], src[:10]) and np.array_equal(dst[990:], src[990:]) and not dst[10:990].any()
    with pytest.raises(ValueError):
        copy(995, 10)
    with pytest.raises(ValueError):
        ContiguousCopy(dst[:10], src)
    with pytest.raises(ValueError):
        ContiguousCopy(dst[::2], src[:500])
