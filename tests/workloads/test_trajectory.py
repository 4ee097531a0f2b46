import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads.trajectory import Trajectory


def _traj(*rounds, agent=3):
    return Trajectory(agent, tuple(TurnSpec(a, g) for a, g in rounds))


def test_lengths_hand_computed():
    t = _traj((100, 10), (20, 5), (0, 7))
    assert [t.context_tokens(i) for i in range(3)] == [0, 110, 135]
    assert [t.input_tokens(i) for i in range(3)] == [100, 130, 135]
    assert [t.end_tokens(i) for i in range(3)] == [110, 135, 142]
    assert t.total_tokens == 142
    assert t.num_turns == 3
    with pytest.raises(IndexError):
        t.input_tokens(3)


def test_truncate_keeps_longest_fitting_prefix():
    t = _traj((100, 10), (20, 5), (0, 7))
    assert t.truncate(142) is t
    assert t.truncate(10_000) is t
    assert t.truncate(141).turns == t.turns[:2]
    assert t.truncate(135).turns == t.turns[:2]
    assert t.truncate(134).turns == t.turns[:1]
    assert t.truncate(110).total_tokens == 110


def test_truncate_first_round_too_long_names_agent_and_sizes():
    with pytest.raises(InputError, match=r"MaxLen 109 is smaller than the first round \(110 tokens\) of agent 3"):
        _traj((100, 10)).truncate(109)


def test_invalid_construction():
    with pytest.raises(ValueError):
        Trajectory(0, ())
    with pytest.raises(ValueError):
        Trajectory(-1, (TurnSpec(1, 1),))
    with pytest.raises(ValueError):
        Trajectory(0, (TurnSpec(1, 1),), arrival_s=-0.5)


def test_equality_and_hash_follow_turns():
    assert _traj((5, 1), (3, 2)) == _traj((5, 1), (3, 2))
    assert _traj((5, 1), (3, 2)) != _traj((5, 1), (3, 3))
    assert hash(_traj((5, 1))) == hash(_traj((5, 1)))


rounds_st = st.lists(st.tuples(st.integers(0, 5000), st.integers(1, 500)), min_size=1, max_size=40)


@given(rounds=rounds_st, max_len=st.integers(1, 100_000))
def test_truncate_property(rounds, max_len):
    t = _traj(*rounds)
    ends = [t.end_tokens(i) for i in range(t.num_turns)]
    if ends[0] > max_len:
        with pytest.raises(InputError):
            t.truncate(max_len)
        return
    cut = t.truncate(max_len)
    n = cut.num_turns
    assert cut.turns == t.turns[:n]
    assert cut.total_tokens <= max_len
    assert n == t.num_turns or ends[n] > max_len
    assert [cut.input_tokens(i) for i in range(n)] == [t.input_tokens(i) for i in range(n)]
    assert cut.total_tokens == sum(a + g for a, g in rounds[:n])
