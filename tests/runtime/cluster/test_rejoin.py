"""Engine places (runtime/router/rejoin.py), without engine processes: which place a joining
engine is offered and under which incarnation; a fenced place's successor is re-admitted, a late
or duplicate Hello changes nothing, and the other engines hear EngineUp."""

from __future__ import annotations

from types import SimpleNamespace

from dualpath.config import RuntimeConfig
from dualpath.runtime.protocol import EngineRole, EngineUp, Hello
from dualpath.runtime.router.liveness import Liveness
from dualpath.runtime.router.rejoin import offer_place, on_hello

P, D = EngineRole.PREFILL, EngineRole.DECODE


class Box:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, msg) -> None:
        self.sent.append(msg)

    def send_many(self, msgs) -> None:
        self.sent.extend(msgs)

    def close(self) -> None:
        pass


def _router(num_decode: int = 2) -> SimpleNamespace:
    r = SimpleNamespace(cfg=RuntimeConfig(model="tiny", num_prefill=1, num_decode=num_decode), engines={}, buffers={},
                        offered={}, liveness=Liveness(5.0), token=None, full_block_bytes=4096, scheduler=None,
                        requests={}, unscheduled=[])
    r.live_engines = lambda: [e for e in r.engines.values() if r.liveness.is_alive(e.engine)]
    r.servable = lambda: {e.role for e in r.live_engines()} == {P, D}
    return r


def _hello(engine: int, role: EngineRole) -> Hello:
    return Hello(engine, role, f"tcp://127.0.0.1:{7000 + engine}", 4096 if role == D else 0, 1 << 20, 0.0, 0.0,
                 f"seg{engine}", 8, f"127.0.0.1:{8000 + engine}")


def test_places_are_offered_by_role_and_a_fenced_one_under_its_next_incarnation():
    r = _router()
    assert offer_place(r, D) == (1, 0, "") and offer_place(r, D) == (2, 0, "")  # two fresh decode places
    assert offer_place(r, D) == (-1, 0, "every decode place of 1P2D is taken")
    assert offer_place(r, P, wanted=0) == (0, 0, "")
    for e, role in ((0, P), (1, D), (2, D)):
        on_hello(r, _hello(e, role))
    assert r.offered == {} and sorted(r.engines) == [0, 1, 2]
    r.liveness.fence(2, "killed by SIGKILL")
    assert offer_place(r, D) == (2, 1, "")  # the fenced place, incarnation 1
    assert offer_place(r, D)[0] == -1  # offered already: not to a second stranger
    assert offer_place(r, D, wanted=2) == (2, 2, "")  # its own successor, restarted again: a later one


def test_a_successor_is_readmitted_and_the_others_hear_engine_up():
    r = _router(num_decode=1)
    for e, role in ((0, P), (1, D)):
        offer_place(r, role, e)
        on_hello(r, _hello(e, role))
    pe_box = r.engines[0].outbox = Box()
    old_state = r.engines[1]
    r.liveness.fence(1, "its Ray actor died")
    on_hello(r, _hello(1, D))  # a late Hello of the fenced holder (never offered): ignored
    assert r.engines[1] is old_state and not r.liveness.is_alive(1)
    assert offer_place(r, D, wanted=1) == (1, 1, "")
    on_hello(r, _hello(1, D))
    assert r.liveness.is_alive(1) and r.liveness.incarnation[1] == 1 and r.liveness.restarts == {1: 1}
    assert r.engines[1] is not old_state and r.buffers[1].name == "seg1"
    assert pe_box.sent == [EngineUp(1, 1)]
    fresh = r.engines[1]
    on_hello(r, _hello(1, D))  # a duplicate for a live place
    assert r.engines[1] is fresh and pe_box.sent == [EngineUp(1, 1)]
