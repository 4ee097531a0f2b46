"""The router's liveness bookkeeping (runtime/router/liveness.py) and what a lost DE's queued
persists do to placement, without engine processes."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time
from types import SimpleNamespace

from dualpath.runtime.protocol import EngineRole
from dualpath.runtime.router.liveness import ExitWatch, Liveness, describe_down, engine_health, exit_cause
from dualpath.runtime.router.placement import Placement


def test_an_engine_is_overdue_only_past_the_timeout_and_fencing_is_for_good():
    lv = Liveness(timeout_s=2.0)
    lv.seen(0, 10.0)
    lv.seen(1, 11.5)
    assert lv.overdue([0, 1, 2], 12.0) == []  # 2 never beat: not judged (it has not said hello)
    assert lv.overdue([0, 1], 12.5) == [(0, 2.5)]
    assert lv.fence(0, "sent no heartbeat for 2.5 s (frozen)") and not lv.fence(0, "killed by SIGKILL")
    lv.seen(0, 13.0)  # a fenced engine that wakes (SIGCONT) stays fenced
    assert not lv.is_alive(0) and lv.down == {0: "sent no heartbeat for 2.5 s (frozen)"}
    assert lv.overdue([0, 1], 20.0) == [(1, 8.5)]


def test_exit_causes_name_the_signal():
    assert exit_cause(-signal.SIGKILL) == "killed by SIGKILL"
    assert exit_cause(-signal.SIGTERM) == "killed by SIGTERM"
    assert exit_cause(3) == "exited with code 3"


def test_health_is_degraded_while_every_role_has_a_live_engine():
    engines = {e: SimpleNamespace(engine=e, role=role) for e, role in
               ((0, EngineRole.PREFILL), (1, EngineRole.DECODE), (2, EngineRole.DECODE))}
    lv = Liveness(5.0)
    assert engine_health(engines, lv)["status"] == "ok"
    lv.fence(1, "killed by SIGKILL")
    h = engine_health(engines, lv)
    assert (h["status"], h["live_engines"], h["down"]) == ("degraded", 2, [{"engine": 1, "role": "decode", "cause": "killed by SIGKILL"}])
    lv.fence(2, "sent no heartbeat for 5.1 s (frozen)")
    assert engine_health(engines, lv)["status"] == "unavailable"
    assert describe_down(engines, lv) == "decode engine 1 killed by SIGKILL, decode engine 2 sent no heartbeat for 5.1 s (frozen)"


def test_exit_watch_reports_a_killed_process_at_once():
    ctx = mp.get_context("spawn")
    p = ctx.Process(target=time.sleep, args=(600,), daemon=True)
    p.start()
    seen: list[tuple[int, str, float]] = []
    watch = ExitWatch({7: p}, lambda e, cause: seen.append((e, cause, time.monotonic())))
    watch.start()
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGKILL)
    while not seen and time.monotonic() - t0 < 5:
        time.sleep(0.01)
    watch.stop()
    assert [(e, c) for e, c, _ in seen] == [(7, "killed by SIGKILL")]
    assert seen[0][2] - t0 < 1.0  # the sentinel wakes the watch: no polling period to wait out


def test_a_dead_engines_queued_persists_stop_blocking_placement():
    class Store:
        def lookup(self, digests):
            return 0

    placement = Placement(Store(), {}, block_tokens=2)
    prompt = [1, 2, 3, 4, 5]
    digests = placement.digests(prompt)
    assert placement.lookup(prompt, digests) == 0
    placement.persist_queued(digests[:1], engine=3)
    placement.persist_queued(digests[:1], engine=4)
    assert placement.blocked_by_persist(prompt, digests, 0)
    placement.engine_lost(3)
    assert placement.persisting == {digests[0]: 1}  # engine 4's write is still in flight
    placement.persisted(digests[0], engine=4)
    assert placement.persisting == {} and not placement.blocked_by_persist(prompt, digests, 0)
    placement.check_invariants()
