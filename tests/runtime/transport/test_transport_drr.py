"""DeficitRoundRobin: byte shares, work conservation, one-chunk wait, merged == step by step."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.lanes import Lane, LaneWeights
from dualpath.runtime.transport.drr import DeficitRoundRobin

LC, KV = Lane.LATENCY_CRITICAL, Lane.KV
CHUNK = 1024


def _sent_by_lane(drr, num_chunks, now_s=0.0):
    sent = {LC: 0, KV: 0}
    for _ in range(num_chunks):
        g = drr.next_chunk(now_s)
        sent[g.lane] += g.nbytes
    return sent


def test_two_backlogged_lanes_share_99_to_1_exactly_per_round():
    drr = DeficitRoundRobin(LaneWeights(), CHUNK)
    drr.push(LC, "lc", 10**9, 0.0)
    drr.push(KV, "kv", 10**9, 0.0)
    sent = _sent_by_lane(drr, 100 * 50)  # 50 rounds of 99 + 1 chunks
    assert sent[LC] == 99 * sent[KV] == 99 * 50 * CHUNK
    drr.check_invariants()


def test_an_idle_lane_leaves_the_whole_link_to_the_other():
    drr = DeficitRoundRobin(LaneWeights(), CHUNK)
    drr.push(KV, "kv", 10**9, 0.0)
    assert _sent_by_lane(drr, 500) == {LC: 0, KV: 500 * CHUNK}
    drr.check_invariants()


def test_latency_critical_arrival_waits_at_most_one_kv_chunk():
    drr = DeficitRoundRobin(LaneWeights(), CHUNK)
    drr.push(KV, "kv", 10**9, 0.0)
    for _ in range(7):
        assert drr.next_chunk(1.0).lane is KV
    drr.push(LC, "lc", 10 * CHUNK, 1.0)
    g = drr.next_chunk(1.0)
    assert (g.lane, g.item, g.offset_bytes) == (LC, "lc", 0)


def test_fifo_within_a_lane_and_future_arrivals_are_not_eligible():
    drr = DeficitRoundRobin(LaneWeights(), CHUNK)
    drr.push(KV, "a", CHUNK, 0.0)
    drr.push(KV, "b", CHUNK, 2.0)
    assert drr.next_chunk(1.0).item == "a"
    assert drr.next_chunk(1.0) is None
    assert drr.earliest_arrival_s() == 2.0
    assert drr.next_chunk(2.0).item == "b"


def test_drop_and_drain_keep_the_ledger():
    drr = DeficitRoundRobin(LaneWeights(), CHUNK)
    drr.push(KV, "a", 3 * CHUNK, 0.0)
    drr.push(LC, "b", 2 * CHUNK, 0.0)
    drr.next_chunk(0.0)
    assert drr.drop("b") == CHUNK
    drr.check_invariants()
    assert drr.drain() == [("a", 3 * CHUNK)]
    drr.check_invariants()
    assert not drr.has_pending()


RATE = float(1 << 20)  # bytes/s; with dyadic arrival times every link time below is exact


def _simulate(transfers, weights, merge, window_s):
    """Run a rate-limited link the way LinkArbiter plans it; returns completion time per item."""
    drr = DeficitRoundRobin(weights, CHUNK)
    pending = sorted(transfers, key=lambda x: x[2])
    done, t, now, i = {}, 0.0, 0.0, 0
    while len(done) < len(transfers):
        now += window_s
        while i < len(pending) and pending[i][2] <= now:
            item, lane, arrival, nbytes = pending[i]
            drr.push(lane, item, nbytes, arrival)
            i += 1
        while t < now:
            g = drr.next_chunk(t, now, RATE) if merge else drr.next_chunk(t)
            if g is None:
                a = drr.earliest_arrival_s()
                if a is None or a >= now:
                    break
                t = a
                continue
            t += g.nbytes / RATE
            if g.is_last:
                done[g.item] = t
        drr.check_invariants()
    return done


@settings(max_examples=150, deadline=None)
@given(
    raw=st.lists(st.tuples(st.sampled_from([LC, KV]), st.integers(0, 200), st.integers(1, 40),
                           st.sampled_from([1, 100, 1024])), min_size=1, max_size=12),
    w=st.tuples(st.sampled_from([1.0, 3.0, 10.0, 99.0]), st.sampled_from([1.0, 2.0, 5.0])),
    window=st.sampled_from([1, 7, 37]),
)
def test_merged_decisions_give_the_step_by_step_schedule(raw, w, window):
    transfers = [(k, lane, at / 1024, n * unit) for k, (lane, at, n, unit) in enumerate(raw)]
    weights = LaneWeights(*w)
    step = _simulate(transfers, weights, merge=False, window_s=1 / 1024)
    assert _simulate(transfers, weights, merge=True, window_s=window / 1024) == step
    assert _simulate(transfers, weights, merge=False, window_s=window / 1024) == step


def _chunk_sequence(transfers, weights, run_bytes):
    """Chunks (item, offset, nbytes) a real-speed link sends, one decision per chunk
    (run_bytes None) or in runs cut short when the other lane gets a transfer. Transfer k
    arrives just before the decision of chunk number transfers[k][1]."""
    drr = DeficitRoundRobin(weights, CHUNK)
    order = sorted(range(len(transfers)), key=lambda k: transfers[k][1])
    out, step, p = [], 0, 0

    def arrive():
        nonlocal p
        lanes = set()
        while p < len(order) and transfers[order[p]][1] <= step:
            k = order[p]
            lane, _, nbytes = transfers[k]
            drr.push(lane, k, nbytes, 0.0)
            lanes.add(lane)
            p += 1
        return lanes

    while p < len(order) or drr.has_pending():
        arrive()
        if run_bytes is None:
            g = drr.next_chunk(0.0)
            if g is not None:
                out.append((g.item, g.offset_bytes, g.nbytes))
            step += 1
            continue
        g = drr.next_run(0.0, run_bytes)
        if g is None:
            step += 1
            continue
        sent = 0
        for n in drr.run_pieces():
            out.append((g.item, g.offset_bytes + sent, n))
            sent += n
            step += 1
            if ({LC, KV} - {g.lane}) & arrive() and sent < g.nbytes:
                break
        assert drr.end_run(sent) == g.nbytes - sent
        drr.check_invariants()
    return out


@settings(max_examples=150, deadline=None)
@given(
    raw=st.lists(st.tuples(st.sampled_from([LC, KV]), st.integers(0, 60), st.integers(1, 40),
                           st.sampled_from([1, 100, 1024])), min_size=1, max_size=10),
    w=st.tuples(st.sampled_from([1.0, 3.0, 99.0]), st.sampled_from([1.0, 2.0, 5.0])),
    run_bytes=st.sampled_from([1, 1000, 3 * CHUNK, 7 * CHUNK + 5, 10**9]),
)
def test_runs_cut_at_the_other_lanes_arrival_give_the_step_by_step_chunks(raw, w, run_bytes):
    transfers = [(lane, at, n * unit) for lane, at, n, unit in raw]
    weights = LaneWeights(*w)
    assert _chunk_sequence(transfers, weights, run_bytes) == _chunk_sequence(transfers, weights, None)


def test_a_run_covers_the_transfer_if_uncontested_else_the_rest_of_the_turn():
    drr = DeficitRoundRobin(LaneWeights(), CHUNK)
    drr.push(KV, "kv", 10 * CHUNK + 1, 0.0)
    g = drr.next_run(0.0, 10**9)
    assert (g.item, g.offset_bytes, g.nbytes, g.is_last) == ("kv", 0, 10 * CHUNK + 1, True)
    assert list(drr.run_pieces()) == [CHUNK] * 10 + [1]
    drr.push(LC, "lc", CHUNK, 0.0)  # arrives during the 3rd chunk: the run stops after it
    assert drr.end_run(3 * CHUNK) == 7 * CHUNK + 1
    assert drr.next_run(0.0, 10**9).item == "lc"
    drr.end_run(CHUNK)
    drr.push(LC, "lc2", 500 * CHUNK, 0.0)
    g = drr.next_run(0.0, 10**9)  # KV is queued: the rest of LC's turn (99 chunks, 1 spent)
    assert (g.item, g.offset_bytes, g.nbytes) == ("lc2", 0, 98 * CHUNK)
    drr.end_run(g.nbytes)
    g = drr.next_run(0.0, 10**9)  # then one KV chunk (its quantum)
    assert (g.item, g.offset_bytes, g.nbytes) == ("kv", 3 * CHUNK, CHUNK)
    drr.end_run(g.nbytes)
    g = drr.next_run(0.0, 10**9)
    assert (g.item, g.offset_bytes, g.nbytes) == ("lc2", 98 * CHUNK, 99 * CHUNK)
    drr.drop("lc2")
    drr.end_run(g.nbytes)
    g = drr.next_run(0.0, 10**9)  # uncontested again: the rest of KV in one run
    assert (g.item, g.offset_bytes, g.nbytes) == ("kv", 4 * CHUNK, 6 * CHUNK + 1)
    drr.end_run(g.nbytes)
    assert not drr.has_pending()
    drr.check_invariants()
