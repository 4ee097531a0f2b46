"""Algorithm 1 (docs/paper.md §3.2): hand-computed cases for every branch, and FIFO as a property."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.policy import PrefillThresholds, select_prefill
from dualpath.core.request import RequestId
from dualpath.core.snapshot import EngineLoad, QueuedRequest


def q(*lens):
    return [QueuedRequest(RequestId(i, 0), n, 0, 0) for i, n in enumerate(lens)]


TH = PrefillThresholds(alpha_tokens=100, beta_tokens=1000)


def test_short_read_queue_engines_are_preferred_even_when_busier():
    # engine 0 on node 0 (read_q 500 > alpha: C3), engine 1 on node 1 (read_q 50: C2)
    group = [EngineLoad(0, 0, 0, 0), EngineLoad(1, 1, 3, 900)]
    out = select_prefill(group, {0: 500, 1: 50}, q(50), TH)
    assert [(a.rid.agent, a.engine) for a in out] == [(0, 1)]


def test_long_queue_engines_take_work_when_no_short_one_is_open():
    # engine 1 is C2 but over beta (overloaded) -> C3 engine 0 gets the request
    group = [EngineLoad(0, 0, 0, 10), EngineLoad(1, 1, 9, 1001)]
    out = select_prefill(group, {0: 500, 1: 50}, q(50), TH)
    assert [a.engine for a in out] == [0]


def test_overloaded_everywhere_assigns_nothing():
    group = [EngineLoad(0, 0, 5, 1001), EngineLoad(1, 0, 5, 5000)]
    assert select_prefill(group, {0: 0}, q(1, 2, 3), TH) == ()


def test_least_tokens_within_a_category_and_tok_updates_within_a_fetch():
    group = [EngineLoad(0, 0, 0, 300), EngineLoad(1, 0, 0, 100), EngineLoad(2, 0, 0, 100)]
    # all C2 (read_q 0). r0 (400) -> engine 1 (tie 100 with 2: lower id) -> tok1 = 500
    # r1 (100) -> engine 2 (100) -> 200; r2 (100) -> engine 2 (200) -> 300;
    # r3 (50) -> engines 0 and 2 at 300: lower id 0 -> 350
    out = select_prefill(group, {0: 0}, q(400, 100, 100, 50), TH)
    assert [a.engine for a in out] == [1, 2, 2, 0]


def test_an_engine_leaves_the_open_set_once_it_passes_beta():
    group = [EngineLoad(0, 0, 0, 900)]
    # 900 <= 1000: takes r0 (200) -> 1100 > beta: the fetch ends with r1 still queued
    out = select_prefill(group, {0: 0}, q(200, 10), TH)
    assert [a.rid.agent for a in out] == [0]


def test_exactly_at_thresholds_counts_as_short_and_open():
    group = [EngineLoad(0, 0, 0, 1000), EngineLoad(1, 1, 0, 0)]
    # engine 0: read_q == alpha (short) and tok == beta (open): C2 with 1000 tokens;
    # engine 1: read_q 101 (long): C3 with 0 tokens -> C2 wins despite more tokens
    out = select_prefill(group, {0: 100, 1: 101}, q(1), TH)
    assert [a.engine for a in out] == [0]


@settings(max_examples=200, deadline=None)
@given(
    toks=st.lists(st.integers(0, 2000), min_size=1, max_size=6),
    readq=st.lists(st.integers(0, 300), min_size=3, max_size=3),
    lens=st.lists(st.integers(1, 600), min_size=0, max_size=30),
)
def test_assignments_are_a_fifo_prefix_and_respect_beta(toks, readq, lens):
    group = [EngineLoad(i, i % 3, 0, t) for i, t in enumerate(toks)]
    queue = q(*lens)
    out = select_prefill(group, {0: readq[0], 1: readq[1], 2: readq[2]}, queue, TH)
    assert [a.rid for a in out] == [r.rid for r in queue[: len(out)]]
    tok = {e.engine: e.num_tokens for e in group}
    for a, r in zip(out, queue):
        assert tok[a.engine] <= TH.beta_tokens  # only open engines receive work
        tok[a.engine] += r.num_tokens
    if len(out) < len(queue):  # the fetch ended because every engine was overloaded
        assert all(t > TH.beta_tokens for t in tok.values())
