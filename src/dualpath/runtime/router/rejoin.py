"""Engine places: who may take one, and a fenced engine's place taken again by its successor.

A joined engine (engine/join.py) that restarts (a Ray actor Ray restarted after its process died,
deploy/ray/engines.py) asks for its place again; the router gives it back, so a cluster
heals instead of running one engine short for good.

  1. Offer (`offer_place`, on a `Join`): the place asked for if it is free, else the lowest free
     place of the role: first one never taken, then one whose holder was fenced. A fenced place is
     offered under the next incarnation (the last one's + 1): the Welcome carries it, the successor
     names it in every remote-write hello, so its peers tell it from the fenced process.
  2. Hello (`on_hello`): a place never taken is admitted as at start-up; a fenced place offered
     under incarnation k is re-admitted (`readmit`): liveness.py marks it alive under k, its node's
     buffer ledger starts afresh (recovery.py freed every region on the old one), every other
     live engine hears `EngineUp` (it waits for that engine's layers again; the remote-write fence
     keeps refusing the old incarnation), and the queued requests go to a scheduler over the live
     engines, the successor among them. A Hello for a live place (a duplicate) changes nothing.
  3. Waiting for a restart (`engine_restart_wait_s` > 0, a cluster whose engines restart): when a
     role loses its last engine, its requests are not failed at once but wait, unscheduled, for a
     successor; new requests join them (recovery.py `restart_pending`). If none is re-admitted
     within the wait, each waiting request ends with `ServiceUnavailable` naming the cause, and new
     ones get a 503 (`restart_overdue`).
So an in-flight request of a dead engine ends within the failure's detection (process exit: at
once; a frozen engine: the heartbeat timeout) plus `engine_restart_wait_s`: its tokens, or an error.
"""

from __future__ import annotations

from typing import Any

from ..protocol import EngineRole, EngineUp, Hello
from ..transport.channel import Outbox
from ..transport.shm import SlotLedger
from .recovery import unbook
from .state import EngineState


def role_ids(router: Any, role: EngineRole) -> range:
    cfg = router.cfg
    return range(cfg.num_prefill) if role == EngineRole.PREFILL else range(cfg.num_prefill, cfg.num_prefill + cfg.num_decode)


def offer_place(router: Any, role: EngineRole, wanted: int = -1) -> tuple[int, int, str]:
    """(engine id, incarnation, "") for a joining `role` engine, or (-1, 0, why not). Step 1."""
    ids = role_ids(router, role)
    fresh = [e for e in ids if e not in router.engines and e not in router.offered]
    fenced = [e for e in ids if e in router.engines and not router.liveness.is_alive(e)]
    free = fresh + [e for e in fenced if e not in router.offered]
    if wanted in fresh or wanted in fenced:  # asked for by name: re-offered even while offered
        engine = wanted  # (a successor that restarted again before its Hello)
    elif free:
        engine = free[0]
    else:
        cfg = router.cfg
        return -1, 0, f"every {role} place of {cfg.num_prefill}P{cfg.num_decode}D is taken"
    incarnation = 0
    if engine in router.engines:
        incarnation = max(router.liveness.incarnation.get(engine, 0), router.offered.get(engine, 0)) + 1
    router.offered[engine] = incarnation
    return engine, incarnation, ""


def _state(router: Any, msg: Hello) -> EngineState:
    """The router's record of the engine that said `msg`, its buffer's ledger beside it."""
    e = EngineState(msg.engine, EngineRole(msg.role), msg.endpoint, kv_capacity_tokens=msg.kv_capacity_tokens,
                    prefill_tokens_per_s=msg.prefill_tokens_per_s, outbox=Outbox(msg.endpoint, token=router.token),
                    data_endpoint=msg.data_endpoint)
    router.engines[msg.engine] = e
    router.buffers[msg.engine] = SlotLedger(msg.buffer_segment, router.full_block_bytes, msg.buffer_slots)
    return e


def on_hello(router: Any, msg: Hello) -> None:
    """Step 2: admit, re-admit, or ignore a Hello."""
    engine = msg.engine
    if engine not in router.engines:
        router.liveness.incarnation[engine] = router.offered.pop(engine, 0)
        _state(router, msg)
    elif not router.liveness.is_alive(engine) and engine in router.offered:
        readmit(router, msg, router.offered.pop(engine))
    # else: a duplicate from a live holder, or a fenced holder's late one: nothing changes


def readmit(router: Any, msg: Hello, incarnation: int) -> None:
    """A successor takes fenced `msg.engine`'s place under `incarnation` (step 2)."""
    # the old record's outbox stays open: a finished attempt may still hold it (its sends reach no one)
    router.liveness.readmit(msg.engine, incarnation)
    _state(router, msg)
    for e in router.live_engines():
        if e.engine != msg.engine:
            e.outbox.send(EngineUp(msg.engine, incarnation))
    if not router.servable() or router.scheduler is None:  # still a role short, or before start-up's end
        return
    router.restart_deadline_s = None
    queued = [rr for rr in router.requests.values() if not rr.placed and rr not in router.unscheduled]
    for rr in queued:
        unbook(router, rr)
    router.new_scheduler(sorted(queued, key=lambda r: (r.stream_rid, r.rid)))
