"""What the router does with the requests of an engine it has lost (dead, or frozen and fenced).

Numbered path (`engine_lost`, on the router's event loop, once per engine):
  0. How it is lost: its process exits (the cluster's exit watch, one host), it says it is leaving
     (`Leaving`, on SIGTERM: `on_leaving`), or it misses its heartbeats (`check_heartbeats`).
  1. Fence: liveness.py marks the engine down for good and the cluster kills it; every surviving
     engine hears `EngineDown` (a PE forward waiting for that DE's layers goes on); the engine's
     queued persists stop blocking placement.
  2. Each placed request (assignments sent) that used it loses that side: the router releases the
     side's load, HBM reservation, regions and read charge itself (the engine will never report),
     and cancels the request on its other engine, which reports as usual; the record leaves
     `requests` once both sides are done. A request is hit if its stream is still open and it
     still needed the engine: its DE, always; its PE, until the DE has the prompt (`PromptLoaded`)
     or the PE let it go (`PrefillDone`).
  3. A hit request, policy `recompute` with retries left and an engine of each role alive,
     migrates (Dynamo's request migration): a new attempt (a new engine-side id) carries the
     client's prompt plus every token streamed so far as its prompt and the rest of the budget;
     its KV is read from the store as far as the dead engine persisted it, the rest recomputed;
     a DE-path read whose DE died goes to the PE path. Its tokens continue the client's stream at
     the next index, so a greedy stream is the same as without the fault. Otherwise the stream
     ends with `ServiceUnavailable` naming the cause (HTTP 503, or an SSE error event).
  4. Requests not yet placed are unbooked and queued again on a scheduler over the live engines
     (or, with a role left empty, fail the same way); new requests then get a 503 at once.
  5. Unless a successor may come (`engine_restart_wait_s` > 0, `restart_pending`; rejoin.py step
     3): then the requests of steps 3-4 wait unscheduled, and fail only when the wait is over.
Each accepted request so ends exactly once: its last token, or one error.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from ...core.snapshot import ReadSide
from ..api import GenerationRequest, ServiceUnavailable
from ..protocol import HEARTBEATS_PER_TIMEOUT, Cancel, EngineDown, Leaving
from .liveness import describe_down
from .state import EngineState, RouterRequest


def on_leaving(router: Any, msg: Leaving) -> None:
    """An engine told to end (SIGTERM, engine/leave.py) says so: lost now, not a heartbeat timeout
    later. A message from an earlier holder of the place (a restarted engine's) is ignored."""
    if msg.incarnation == router.liveness.incarnation.get(msg.engine, 0):
        engine_lost(router, msg.engine, "killed by SIGTERM")  # as the exit watch says it (liveness.exit_cause)


def check_heartbeats(router: Any) -> None:
    """Fence every engine silent for longer than the heartbeat timeout (liveness.py step 3); again
    every beat interval, on the router's loop, until the router stops."""
    for engine, silent_s in router.liveness.overdue(list(router.engines), router.clock.now_s()):
        engine_lost(router, engine, f"sent no heartbeat for {silent_s:.1f} s (frozen)")
    interval_s = router.cfg.engine_heartbeat_timeout_s / HEARTBEATS_PER_TIMEOUT
    router.watch = asyncio.get_running_loop().call_later(interval_s, check_heartbeats, router)


def engine_lost(router: Any, engine: int, cause: str) -> None:
    """Fence `engine` and recover every request it held (module docstring). `router` is the
    runtime's `Router`; idempotent."""
    if not router.liveness.fence(engine, cause):
        return
    router.on_fence(engine)
    lost: EngineState | None = router.engines.get(engine)
    if lost is None:  # before its Hello: the start-up reports it
        return
    router.placement.engine_lost(engine)
    for e in router.live_engines():
        e.outbox.send(EngineDown(engine, router.liveness.incarnation.get(engine, 0)))
    servable = router.servable() or restart_pending(router)  # step 5: a role short may still wait
    why = f"{lost.role} engine {engine} {cause}"
    requeue: list[RouterRequest] = []
    for rr in sorted(router.requests.values(), key=lambda r: r.rid):
        if rr.placed:
            if lost in (rr.pe, rr.de):
                nxt = _lose_side(router, rr, lost, why, servable)
                if nxt is not None:
                    requeue.append(nxt)
        elif rr not in router.unscheduled and (rr.de is None or lost in (rr.pe, rr.de)):
            unbook(router, rr)  # queued in the old scheduler, or placing on the lost engine
            if servable:
                requeue.append(rr)
            else:
                router.requests.pop(rr.rid, None)
                fail(router, rr, f"{why}; no engine of its role is left")
    if not servable:
        for rr in list(router.unscheduled):
            router.unscheduled.remove(rr)
            router.requests.pop(rr.rid, None)
            fail(router, rr, f"{why}; no engine of its role is left")
    requeue.sort(key=lambda r: (r.stream_rid, r.rid))
    if router.scheduler is not None and router.servable():
        router.new_scheduler(requeue)
    elif servable:  # waiting for a successor (step 5): the old scheduler stays frozen
        router.unscheduled.extend(requeue)
    router.kick()


def _lose_side(router: Any, rr: RouterRequest, lost: EngineState, why: str, servable: bool) -> RouterRequest | None:
    """Step 2-3 for a placed request; returns its next attempt if it migrates."""
    hit = False
    if rr.pe is lost and not rr.pe_done:
        router.bookings.pe_released(rr)
        router.placement.free(lost.engine, rr.pe_regions)
        rr.pe_regions, rr.pe_done = [], True
        hit = not rr.prompt_loaded
    if rr.de is lost and not rr.de_done:
        router.bookings.de_released(rr)
        router.placement.free(lost.engine, rr.de_regions)  # the dead node's buffer: never allocated again
        rr.de_regions, rr.de_done = [], True
        hit = True
    if rr.side_engine is lost:
        router.bookings.read_ended(rr)  # the dead node's read never reports
    nxt = None
    if hit and not rr.finished:
        for e, done in ((rr.pe, rr.pe_done), (rr.de, rr.de_done)):
            if not done and router.liveness.is_alive(e.engine):
                e.outbox.send(Cancel(rr.rid))
        rr.finished = rr.cancelled = True  # this attempt's later tokens are dropped
        nxt, refusal = next_attempt(router, rr, lost) if servable else (None, "no engine of its role is left")
        if nxt is None:
            fail(router, rr, f"{why}; {refusal}")
    if rr.pe_done and rr.de_done:
        router.bookings.read_ended(rr)
        router.requests.pop(rr.rid, None)
    return nxt


def unbook(router: Any, rr: RouterRequest) -> None:
    """Undo what passes booked for a request no engine has heard of (nothing was sent)."""
    if rr in router.placing:
        router.placing.remove(rr)
    elif router.scheduler is not None:
        router.scheduler.cancel(rr.qview.rid)
    if rr.pe is not None:
        router.bookings.pe_released(rr)
    if rr.de is not None:
        router.bookings.de_released(rr)
        router.bookings.read_ended(rr)
    rr.unassign()


def next_attempt(router: Any, rr: RouterRequest, lost: EngineState) -> tuple[RouterRequest | None, str]:
    """(the migrated request (step 3), registered with the router, ""), or (None, why not) when
    the policy or the retry budget says the stream ends with an error."""
    cfg = router.cfg
    if cfg.engine_fault_policy != "recompute":
        return None, f"engine_fault_policy is {cfg.engine_fault_policy}"
    if rr.attempt >= cfg.engine_fault_retries:
        return None, f"its {rr.attempt} retries (engine_fault_retries) are spent"
    origin = rr.origin
    done = len(rr.emitted)
    p = origin.params
    params = replace(p, max_tokens=p.max_tokens - done, min_tokens=max(0, p.min_tokens - done),
                     seed=p.seed if p.seed is not None else rr.stream_rid)
    req = GenerationRequest(origin.request_id, tuple(origin.prompt_ids) + tuple(rr.emitted), params)
    nxt = router.new_record(req, rr.queue)
    nxt.origin, nxt.client_rid, nxt.attempt = origin, rr.stream_rid, rr.attempt + 1
    nxt.emitted, nxt.base_tokens = list(rr.emitted), done
    nxt.pe_side_only = rr.pe_side_only or (lost is rr.de and rr.side is ReadSide.DECODE)
    rr.successor = nxt
    router.metrics.migrated(rr.stream_rid)
    return nxt, ""


def fail(router: Any, rr: RouterRequest, why: str) -> None:
    """End the client's stream with an error naming the cause (exactly once)."""
    rr.finished = rr.cancelled = True
    if not rr.failed:
        rr.failed = True
        router.metrics.failed(rr.stream_rid)
        rr.queue.put_nowait(ServiceUnavailable(f"the request failed: {why}"))


def restart_pending(router: Any) -> bool:
    """A role short of engines may still get a successor in time (step 5): the first call after
    the loss starts the wait and its timer."""
    wait_s = router.cfg.engine_restart_wait_s
    if wait_s <= 0:
        return False
    now_s = router.clock.now_s()
    if router.restart_deadline_s is None:
        router.restart_deadline_s = now_s + wait_s
        router._loop.call_later(wait_s, restart_overdue, router)
    return now_s < router.restart_deadline_s


def restart_overdue(router: Any) -> None:
    """The wait is over (step 5): if a role is still short, every waiting request ends with an error."""
    if router.servable() or router.restart_deadline_s is None:
        return
    why = (f"{describe_down(router.engines, router.liveness)}; no successor joined within "
           f"engine_restart_wait_s ({router.cfg.engine_restart_wait_s:g} s)")
    while router.unscheduled:
        rr = router.unscheduled.popleft()
        router.requests.pop(rr.rid, None)
        fail(router, rr, why)
