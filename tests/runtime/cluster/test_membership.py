"""Engine places and losses (runtime/router/membership.py), without engine processes: which place a
joining engine is offered and under which incarnation; a fenced place's successor is re-admitted, a
late or duplicate Hello changes nothing, and the other engines hear EngineUp; a lost engine is
fenced once, the others hear EngineDown, and the request side is told whether the cluster still serves."""

from __future__ import annotations

from dualpath.config import RuntimeConfig
from dualpath.runtime.clock import ManualClock
from dualpath.runtime.protocol import EngineDown, EngineRole, EngineUp, Hello, Leaving
from dualpath.runtime.router.membership import Membership
from fakes import RecordingOutbox

P, D = EngineRole.PREFILL, EngineRole.DECODE


class Requests:
    """The request side (membership.RequestSide), recording what membership asked of it."""

    def __init__(self) -> None:
        self.calls: list = []

    def engine_lost(self, lost, why: str, servable: bool) -> None:
        self.calls.append(("engine_lost", lost.engine, why, servable))

    def successor_joined(self) -> None:
        self.calls.append(("successor_joined",))

    def wait_over(self, why: str) -> None:
        self.calls.append(("wait_over", why))


def _members(num_decode: int = 2) -> Membership:
    m = Membership(RuntimeConfig(model="tiny", num_prefill=1, num_decode=num_decode), ManualClock(), None, 4096)
    m.requests = Requests()
    return m


def _hello(engine: int, role: EngineRole) -> Hello:
    return Hello(engine, role, f"tcp://127.0.0.1:{7000 + engine}", 4096 if role == D else 0, 1 << 20, 0.0, 0.0,
                 f"seg{engine}", 8, f"127.0.0.1:{8000 + engine}")


def test_places_are_offered_by_role_and_a_fenced_one_under_its_next_incarnation():
    r = _members()
    assert r.offer_place(D) == (1, 0, "") and r.offer_place(D) == (2, 0, "")  # two fresh decode places
    assert r.offer_place(D) == (-1, 0, "every decode place of 1P2D is taken")
    assert r.offer_place(P, wanted=0) == (0, 0, "")
    for e, role in ((0, P), (1, D), (2, D)):
        r.on_hello(_hello(e, role))
    assert r.offered == {} and sorted(r.engines) == [0, 1, 2]
    r.liveness.fence(2, "killed by SIGKILL")
    assert r.offer_place(D) == (2, 1, "")  # the fenced place, incarnation 1
    assert r.offer_place(D)[0] == -1  # offered already: not to a second stranger
    assert r.offer_place(D, wanted=2) == (2, 2, "")  # its own successor, restarted again: a later one


def test_a_successor_is_readmitted_and_the_others_hear_engine_up():
    r = _members(num_decode=1)
    for e, role in ((0, P), (1, D)):
        r.offer_place(role, e)
        r.on_hello(_hello(e, role))
    pe_box = r.engines[0].outbox = RecordingOutbox()
    old_state = r.engines[1]
    r.liveness.fence(1, "its Ray actor died")
    r.on_hello(_hello(1, D))  # a late Hello of the fenced holder (never offered): ignored
    assert r.engines[1] is old_state and not r.liveness.is_alive(1)
    assert r.offer_place(D, wanted=1) == (1, 1, "")
    r.on_hello(_hello(1, D))
    assert r.liveness.is_alive(1) and r.liveness.incarnation[1] == 1 and r.liveness.restarts == {1: 1}
    assert r.engines[1] is not old_state and r.buffers[1].name == "seg1"
    assert pe_box.sent == [EngineUp(1, 1)]
    fresh = r.engines[1]
    r.on_hello(_hello(1, D))  # a duplicate for a live place
    assert r.engines[1] is fresh and pe_box.sent == [EngineUp(1, 1)]


def test_a_lost_engine_is_fenced_once_and_the_request_side_told_if_the_cluster_still_serves():
    r = _members(num_decode=2)
    boxes = {}
    for e, role in ((0, P), (1, D), (2, D)):
        r.offer_place(role, e)
        r.on_hello(_hello(e, role))
        boxes[e] = r.engines[e].outbox = RecordingOutbox()
    fenced: list[int] = []
    r.on_fence = fenced.append
    r.engine_lost(1, "killed by SIGKILL")
    r.engine_lost(1, "exited with code 1")  # a second report of the same loss
    assert fenced == [1] and r.liveness.down == {1: "killed by SIGKILL"}
    assert boxes[0].sent == boxes[2].sent == [EngineDown(1, 0)] and boxes[1].sent == []
    assert r.requests.calls == [("engine_lost", 1, "decode engine 1 killed by SIGKILL", True)]
    r.engine_lost(2, "sent no heartbeat for 5.2 s (frozen)")  # the last DE, no restart wait: cannot serve
    assert r.requests.calls[-1] == ("engine_lost", 2, "decode engine 2 sent no heartbeat for 5.2 s (frozen)", False)
    assert not r.servable() and r.health()["status"] == "unavailable"


def test_leaving_fences_only_the_current_holder_of_the_place():
    r = _members(num_decode=1)
    for e, role in ((0, P), (1, D)):
        r.offer_place(role, e)
        r.on_hello(_hello(e, role))
        r.engines[e].outbox = RecordingOutbox()
    r.liveness.incarnation[1] = 2  # place 1 is held by its second successor
    r.on_leaving(Leaving(1, 1))  # an earlier holder of place 1: ignored
    assert r.liveness.down == {} and r.requests.calls == []
    r.on_leaving(Leaving(1, 2))
    assert r.liveness.down == {1: "killed by SIGTERM"} and r.requests.calls[0][:2] == ("engine_lost", 1)
