"""DE selection, both phases (docs/paper.md §3.3): hand-computed cases and the HBM property."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.policy import distribute_to_groups, select_decode
from dualpath.core.request import RequestId
from dualpath.core.snapshot import EngineLoad, GroupLoad, QueuedRequest


def req(i, tokens, hbm):
    return QueuedRequest(RequestId(i, 0), tokens, hbm, 0)


def test_phase1_sends_each_request_to_the_group_with_least_tokens_updating_as_it_goes():
    out = distribute_to_groups({0: 100, 1: 40, 2: 60}, [req(0, 50, 0), req(1, 10, 0), req(2, 10, 0), req(3, 5, 0)])
    # r0 -> g1 (40 -> 90); r1 -> g2 (60 -> 70); r2 -> g2 (70 -> 80); r3 -> g2 (80 -> 85)
    assert [a.group for a in out] == [1, 2, 2, 2]


def test_phase1_ties_go_to_lower_group_id():
    assert [a.group for a in distribute_to_groups({3: 0, 1: 0}, [req(0, 1, 0)])] == [1]


def test_phase2_prefers_low_token_des_by_least_seq():
    # E: e0 (seq 5, tok 100), e1 (seq 1, tok 300), e2 (seq 2, tok 100); all free 1000
    # R = both requests (hbm 10 + 10 <= 3000) -> Z = 1.05 * (50 + 50 + 500) / 3 = 210
    g = GroupLoad(0, (EngineLoad(0, 0, 5, 100, 1000), EngineLoad(1, 0, 1, 300, 1000), EngineLoad(2, 0, 2, 100, 1000)))
    out = select_decode(g, [req(0, 50, 10), req(1, 50, 10)])
    # r0: low = {e0: 150, e2: 150} (e1: 350 > 210) -> least seq: e2 (2 < 5); e2 -> seq 3 tok 150
    # r1: low = {e0: 150, e2: 200} -> least seq e2 (3 < 5)
    assert [a.engine for a in out] == [2, 2]


def test_phase2_falls_back_to_least_tokens_when_every_fit_is_over_z():
    # single request of 1000 tokens: Z = 1.05 * (1000 + 200 + 400) / 2 = 840; both DEs go over Z
    g = GroupLoad(0, (EngineLoad(0, 0, 0, 200, 100), EngineLoad(1, 0, 9, 400, 100)))
    out = select_decode(g, [req(0, 1000, 50)])
    assert [a.engine for a in out] == [0]


def test_phase2_skips_des_without_room_and_stops_when_none_fits():
    g = GroupLoad(0, (EngineLoad(0, 0, 0, 0, 30), EngineLoad(1, 0, 0, 0, 100)))
    # r0 hbm 50: only e1 fits -> e1 free 50. r1 hbm 40: e1 (50) fits -> e1 free 10.
    # r2 hbm 35: nobody fits -> stop, r3 (hbm 5) keeps waiting behind it (head-of-line).
    out = select_decode(g, [req(0, 10, 50), req(1, 10, 40), req(2, 10, 35), req(3, 10, 5)])
    assert [a.engine for a in out] == [1, 1]


def test_z_uses_only_the_prefix_that_fits_total_free_hbm():
    # total free 100: R = [r0 (60)] since r0 + r1 = 120 > 100 -> Z = 1.05 * (10 + 0 + 0) / 2 = 5.25
    # r0 (10 tokens) goes over Z everywhere -> least tok, lower id -> e0
    g = GroupLoad(0, (EngineLoad(0, 0, 0, 0, 50), EngineLoad(1, 0, 0, 0, 50)))
    out = select_decode(g, [req(0, 10, 40), req(1, 1000, 60)])
    assert [a.engine for a in out][:1] == [0]


@settings(max_examples=200, deadline=None)
@given(
    frees=st.lists(st.integers(0, 500), min_size=1, max_size=8),
    toks=st.lists(st.integers(0, 1000), min_size=8, max_size=8),
    reqs=st.lists(st.tuples(st.integers(1, 300), st.integers(1, 200)), max_size=40),
)
def test_no_de_is_assigned_past_its_hbm_and_order_is_a_prefix(frees, toks, reqs):
    g = GroupLoad(0, tuple(EngineLoad(i, 0, 0, toks[i], f) for i, f in enumerate(frees)))
    queue = [req(i, t, h) for i, (t, h) in enumerate(reqs)]
    out = select_decode(g, queue)
    assert [a.rid for a in out] == [r.rid for r in queue[: len(out)]]
    free = {e.engine: e.free_hbm_bytes for e in g.engines}
    for a, r in zip(out, queue):
        free[a.engine] -= r.hbm_bytes
    assert all(v >= 0 for v in free.values())
    if len(out) < len(queue):
        assert max(free.values()) < queue[len(out)].hbm_bytes


@settings(max_examples=200, deadline=None)
@given(
    totals=st.dictionaries(st.integers(0, 40), st.integers(0, 50), min_size=1, max_size=12),
    sizes=st.lists(st.integers(0, 30), max_size=30),
)
def test_phase1_matches_its_definition_least_total_then_lowest_id(totals, sizes):
    # small values force many ties; dict order is arbitrary (not sorted by id)
    expect, running = [], dict(totals)
    for s in sizes:
        g = min(running, key=lambda k: (running[k], k))
        running[g] += s
        expect.append(g)
    out = distribute_to_groups(totals, [req(i, s, 0) for i, s in enumerate(sizes)])
    assert [a.group for a in out] == expect
