"""`+tail` (core/policy/tail.py): a burst spread over the open PE groups, FIFO kept, work-conserving
within a pass, and nothing changed where one request waits or one group is open."""

from __future__ import annotations

import pytest

from dualpath.config import parse_mode
from dualpath.core.policy.prefill import PrefillThresholds
from dualpath.core.policy.tail import share_cap
from dualpath.core.request import RequestId
from dualpath.core.scheduler import ClusterView, GlobalScheduler, SchedulerRules
from dualpath.core.snapshot import EngineLoad, QueuedRequest

GROUPS = (0, 1, 2, 3)  # one PE engine per group; engine id = group id


class _View(ClusterView):
    def __init__(self, tokens: dict[int, int]) -> None:
        self.tokens = tokens

    def pe_loads(self, group):
        return [EngineLoad(group, group, 0, self.tokens.get(group, 0))]

    def de_loads(self, group):
        return [EngineLoad(group, group, 0, 0, free_hbm_bytes=1 << 40)]

    def read_queue_tokens(self, node):
        return 0

    def read_tokens(self, ref):
        return 0

    def store_latency_s(self, node):
        return 0.0


def _pass(tail: bool, n: int, beta: int = 10**9, tokens: dict[int, int] | None = None, dualpath: bool = True):
    s = GlobalScheduler(GROUPS, (10,), SchedulerRules(PrefillThresholds(0, beta), dualpath=dualpath, tail_share=tail))
    for i in range(n):
        s.submit(QueuedRequest(RequestId(i, 0), 100, 1, 100), i)
    p = s.schedule(_View(tokens or {}))
    return [(a.ref, a.engine) for a in p.prefill], s.num_pe_queued


@pytest.mark.parametrize("dualpath", [True, False])
def test_a_burst_goes_to_the_first_group_under_algorithm_1_and_is_spread_under_tail(dualpath):
    plain, _ = _pass(False, 8, dualpath=dualpath)
    assert {e for _, e in plain} == {0}
    spread, left = _pass(True, 8, dualpath=dualpath)
    assert left == 0 and [r for r, _ in spread] == list(range(8))  # FIFO: each group a prefix of what is left
    assert [e for _, e in spread] == [0, 0, 1, 1, 2, 2, 3, 3]


def test_tail_is_work_conserving_within_a_pass():
    # beta 250 tokens, 100 a request; group 0 starts at 200, so it takes one request and closes. The
    # capped sweep (2 each) leaves one request, which a group still open takes in the same pass.
    spread, left = _pass(True, 8, beta=250, tokens={0: 200})
    assert left == 0 and [r for r, _ in spread] == list(range(8))
    assert [e for _, e in spread] == [0, 1, 1, 2, 2, 3, 3, 1]
    plain, plain_left = _pass(False, 8, beta=250, tokens={0: 200})
    assert plain_left == 0 and [e for _, e in plain] == [0, 1, 1, 1, 2, 2, 2, 3]
    # every group over beta after its share: what is left waits under either rule
    for tail in (True, False):
        got, waiting = _pass(tail, 8, beta=150, tokens={g: 100 for g in GROUPS})
        assert len(got) == 4 and waiting == 4


def test_tail_changes_nothing_for_one_request_or_one_open_group():
    assert _pass(True, 1) == _pass(False, 1)
    closed = {g: 10**6 for g in (1, 2, 3)}
    assert _pass(True, 6, beta=10**5, tokens=closed) == _pass(False, 6, beta=10**5, tokens=closed)
    assert share_cap(1, 4) is None and share_cap(9, 1) is None and share_cap(9, 4) == 3


def test_tail_joins_any_mode():
    assert parse_mode("dualpath+tail").tail_share and parse_mode("dualpath+tail").de_read_path
    assert parse_mode("basic+tail").tail_share and not parse_mode("basic+tail").de_read_path
    assert parse_mode("dualpath+split+tail").split_reads and parse_mode("basic+layerwise+tail").layerwise_prefill
    assert not parse_mode("dualpath").tail_share
    with pytest.raises(Exception, match="unknown mode"):
        parse_mode("+tail")
