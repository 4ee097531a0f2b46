from dualpath.core.policy import RoundRobinCursor, choose_read_side, round_robin_decode, round_robin_prefill, round_robin_read_side
from dualpath.core.request import RequestId
from dualpath.core.snapshot import EngineLoad, QueuedRequest, ReadSide


def test_read_side_is_the_shorter_queue_ties_to_prefill():
    assert choose_read_side(10, 5) is ReadSide.DECODE
    assert choose_read_side(5, 10) is ReadSide.PREFILL
    assert choose_read_side(7, 7) is ReadSide.PREFILL


def _q(n, hbm=1):
    return [QueuedRequest(RequestId(i, 0), 10, hbm, 0) for i in range(n)]


def test_round_robin_prefill_rotates_and_skips_overloaded():
    group = [EngineLoad(0, 0, 0, 0), EngineLoad(1, 0, 0, 999), EngineLoad(2, 0, 0, 0)]
    out, cur = round_robin_prefill(group, _q(4), beta_tokens=100, cursor=RoundRobinCursor(0))
    assert [a.engine for a in out] == [0, 2, 0, 2]
    out2, _ = round_robin_prefill(group, _q(1), beta_tokens=100, cursor=cur)
    assert [a.engine for a in out2] == [0]


def test_round_robin_decode_needs_hbm_fit():
    des = [EngineLoad(0, 0, 0, 0, 5), EngineLoad(1, 0, 0, 0, 1)]
    out, _ = round_robin_decode(des, _q(3, hbm=2), RoundRobinCursor(0))
    # r0 -> e0 (5 -> 3); r1 -> e1 lacks room, wraps to e0 (3 -> 1); r2: nobody fits
    assert [a.engine for a in out] == [0, 0]


def test_round_robin_read_side_alternates():
    cur = RoundRobinCursor()
    sides = []
    for _ in range(4):
        s, cur = round_robin_read_side(cur)
        sides.append(s)
    assert sides == [ReadSide.PREFILL, ReadSide.DECODE, ReadSide.PREFILL, ReadSide.DECODE]
