"""The decode engine's mail between a step's layers (runtime/engine/mid_step.py): what is served at
once, what waits, and the order the waiting messages are handled in."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from dualpath.runtime.engine.mid_step import StepInterleave


@dataclass
class Pull:
    rid: int
    n: int


@dataclass
class Other:
    rid: int
    n: int


@dataclass
class Barrier:
    n: int


def _interleave(arrivals: list[list], live: set[int]):
    """Feed `arrivals[l]` before layer l's poll; returns (handled during the step, handled after)."""
    queue: list = []
    handled: list = []
    box = StepInterleave(lambda: queue.pop(0) if queue else None,
                         lambda m: isinstance(m, Pull) and m.rid in live, handled.append)
    for layer, msgs in enumerate(arrivals):
        queue.extend(msgs)
        box.poll(layer)
    during = list(handled)
    served = box.drain()
    assert served == len(during)
    return during, handled[len(during):]


def test_a_live_pull_is_served_at_once_and_the_rest_waits_in_order():
    during, after = _interleave([[Pull(1, 0), Other(2, 1)], [Pull(3, 2)], [Pull(2, 3), Pull(9, 4)]], live={1, 2, 3})
    assert during == [Pull(1, 0), Pull(3, 2)]
    # request 2's pull waits behind its earlier message; request 9 is not live
    assert after == [Other(2, 1), Pull(2, 3), Pull(9, 4)]


def test_a_message_of_no_request_is_a_barrier():
    during, after = _interleave([[Pull(1, 0)], [Barrier(1)], [Pull(1, 2)]], live={1})
    assert during == [Pull(1, 0)]
    assert after == [Barrier(1), Pull(1, 2)]


def test_the_next_step_starts_without_the_last_steps_waiting_messages():
    queue: list = []
    handled: list = []
    box = StepInterleave(lambda: queue.pop(0) if queue else None, lambda m: isinstance(m, Pull), handled.append)
    queue.extend([Other(1, 0), Pull(1, 1)])
    box.poll(0)
    assert box.drain() == 0 and handled == [Other(1, 0), Pull(1, 1)]
    queue.append(Pull(1, 2))
    box.poll(0)  # request 1 no longer waits: served at once
    assert handled[-1] == Pull(1, 2) and box.drain() == 1


_msg = st.one_of(st.builds(Pull, st.integers(0, 3), st.just(0)), st.builds(Other, st.integers(0, 3), st.just(0)),
                 st.builds(Barrier, st.just(0)))


@given(st.lists(st.lists(_msg, max_size=4), max_size=6), st.sets(st.integers(0, 3)))
def test_every_message_is_handled_once_and_each_requests_order_holds(arrivals, live):
    numbered, k = [], 0
    for msgs in arrivals:
        numbered.append([])
        for m in msgs:
            m.n = k
            k += 1
            numbered[-1].append(m)
    during, after = _interleave(numbered, live)
    order = during + after
    assert sorted(m.n for m in order) == list(range(k))
    for rid in range(4):  # one request's messages are handled in the order they arrived
        ns = [m.n for m in order if getattr(m, "rid", None) == rid]
        assert ns == sorted(ns)
    bars = [m.n for m in order if isinstance(m, Barrier)]
    assert bars == sorted(bars)
    for b in bars:  # nothing that arrived after a barrier is handled before it
        assert all(m.n < b for m in order[: order.index(next(m for m in order if m.n == b))])
    assert all(isinstance(m, Pull) and m.rid in live for m in during)
