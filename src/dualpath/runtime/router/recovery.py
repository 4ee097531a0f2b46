"""What the router does with the requests of an engine it has lost (dead, or frozen and fenced:
membership.py steps 0-1 say how it is lost and fenced).

Numbered path (`Recovery.engine_lost`, on the router's event loop, once per engine):
  2. Each placed request (assignments sent) that used it loses that side: the router releases the
     side's load, HBM reservation, regions and read charge itself (the engine will never report),
     and cancels the request on its other engine, which reports as usual; the record leaves
     `requests` once both sides are done. A request is hit if its stream is still open and it
     still needed the engine: its DE, always; its PE, until the DE has the prompt (`PromptLoaded`)
     or the PE let it go (`PrefillDone`). The engine's queued persists stop blocking placement.
  3. A hit request, policy `recompute` with retries left and an engine of each role alive,
     migrates (Dynamo's request migration): a new attempt (a new engine-side id) carries the
     client's prompt plus every token streamed so far as its prompt and the rest of the budget;
     its KV is read from the store as far as the dead engine persisted it, the rest recomputed;
     a DE-path read whose DE died goes to the PE path. Its tokens continue the client's stream at
     the next index, so a greedy stream is the same as without the fault. Otherwise the stream
     ends with `ServiceUnavailable` naming the cause (HTTP 503, or an SSE error event).
  4. Requests not yet placed are unbooked and queued again on a scheduler over the live engines
     (or, with a role left empty, fail the same way); new requests then get a 503 at once.
  5. Unless a successor may come (membership.py step 5): then the requests of steps 3-4 wait
     unscheduled (`successor_joined` schedules them), and fail only when the wait is over (`wait_over`).
Each accepted request so ends exactly once: its last token, or one error.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import replace
from typing import Protocol

from ...config import RuntimeConfig
from ...core.scheduler import GlobalScheduler
from ...core.snapshot import ReadSide
from ..api import GenerationRequest, ServiceUnavailable
from ..protocol import Cancel
from .bookings import Bookings
from .membership import Membership
from .metrics import RouterMetrics
from .placement import Placement
from .state import EngineState, RouterRequest, Stream


class RequestTable(Protocol):
    """What recovery asks of the router: its request records and queues, and a new scheduler."""

    requests: dict[int, RouterRequest]
    unscheduled: deque[RouterRequest]  # waiting for a scheduler (start-up, or a role short)
    placing: deque[RouterRequest]  # both engines chosen, waiting for buffer room

    @property
    def scheduler(self) -> GlobalScheduler | None: ...

    @property
    def metrics(self) -> RouterMetrics: ...

    def new_record(self, request: GenerationRequest, queue: asyncio.Queue) -> RouterRequest: ...

    def new_scheduler(self, queued: list[RouterRequest] = ...) -> None: ...

    def kick(self) -> None: ...


class Recovery:
    """The request side of membership (membership.RequestSide): steps 2-5 of the module docstring."""

    def __init__(self, table: RequestTable, membership: Membership, bookings: Bookings, placement: Placement,
                 cfg: RuntimeConfig) -> None:
        self._table, self._members, self._bookings, self._placement = table, membership, bookings, placement
        self._policy, self._retries = cfg.faults.policy, cfg.faults.retries

    def engine_lost(self, lost: EngineState, why: str, servable: bool) -> None:
        t = self._table
        self._placement.engine_lost(lost.engine)
        requeue: list[RouterRequest] = []
        for rr in sorted(t.requests.values(), key=lambda r: r.rid):
            if rr.placed:
                if lost in (rr.pe_side, rr.de):
                    nxt = self._lose_side(rr, lost, why, servable)
                    if nxt is not None:
                        requeue.append(nxt)
            elif rr not in t.unscheduled and (rr.de is None or lost in (rr.pe_side, rr.de)):
                self.unbook(rr)  # queued in the old scheduler, or placing on the lost engine
                if servable:
                    requeue.append(rr)
                else:
                    t.requests.pop(rr.rid, None)
                    self.fail(rr, f"{why}; no engine of its role is left")
        if not servable:
            self.wait_over(f"{why}; no engine of its role is left")
        requeue.sort(key=lambda r: (r.stream_rid, r.rid))
        if t.scheduler is not None and self._members.servable():
            t.new_scheduler(requeue)
        elif servable:  # waiting for a successor (step 5): the old scheduler stays frozen
            t.unscheduled.extend(requeue)
        t.kick()

    def successor_joined(self) -> None:
        t = self._table
        if t.scheduler is None:  # before start-up's end: the start-up builds it
            return
        queued = [rr for rr in t.requests.values() if not rr.placed and rr not in t.unscheduled]
        for rr in queued:
            self.unbook(rr)
        t.new_scheduler(sorted(queued, key=lambda r: (r.stream_rid, r.rid)))

    def wait_over(self, why: str) -> None:
        t = self._table
        while t.unscheduled:
            rr = t.unscheduled.popleft()
            t.requests.pop(rr.rid, None)
            self.fail(rr, why)

    def _lose_side(self, rr: RouterRequest, lost: EngineState, why: str, servable: bool) -> RouterRequest | None:
        """Step 2-3 for a placed request; returns its next attempt if it migrates."""
        hit = False
        if rr.pe_side is lost and not rr.pe_done:  # its PE, or its relay (+selective: no load booked)
            if rr.pe is lost:
                self._bookings.pe_released(rr)
            self._placement.free(lost.engine, rr.pe_regions)
            rr.pe_regions, rr.pe_done = [], True
            hit = not rr.prompt_loaded
        if rr.de is lost and not rr.de_done:
            self._bookings.de_released(rr)
            self._placement.free(lost.engine, rr.de_regions)  # the dead node's buffer: never allocated again
            rr.de_regions, rr.de_done = [], True
            hit = True
        self._placement.release_de_regions(rr)  # its PE lost: nothing writes into them any more
        self._bookings.read_ended(rr, lost.engine)  # the dead node's read (a split's part) never reports
        nxt = None
        if hit and not rr.finished:
            for e, done in ((rr.pe_side, rr.pe_done), (rr.de, rr.de_done)):
                if not done and self._members.liveness.is_alive(e.engine):
                    e.outbox.send(Cancel(rr.rid))
            nxt, refusal = self.next_attempt(rr, lost) if servable else (None, "no engine of its role is left")
            if nxt is None:
                self.fail(rr, f"{why}; {refusal}")
            else:
                rr.end(Stream.CANCELLED)  # this attempt's later tokens are dropped: `nxt` carries on
        if rr.pe_done and rr.de_done:
            self._bookings.read_ended(rr)
            self._table.requests.pop(rr.rid, None)
        return nxt

    def unbook(self, rr: RouterRequest) -> None:
        """Undo what passes booked for a request no engine has heard of (nothing was sent)."""
        t = self._table
        if rr in t.placing:
            t.placing.remove(rr)
        elif t.scheduler is not None:
            t.scheduler.cancel(rr.qview.rid)
        if rr.pe is not None:
            self._bookings.pe_released(rr)
        if rr.de is not None:
            self._bookings.de_released(rr)
            self._bookings.read_ended(rr)
        rr.unassign()

    def next_attempt(self, rr: RouterRequest, lost: EngineState) -> tuple[RouterRequest | None, str]:
        """(the migrated request (step 3), registered with the router, ""), or (None, why not) when
        the policy or the retry budget says the stream ends with an error."""
        if self._policy != "recompute":
            return None, f"faults.policy is {self._policy}"
        if rr.attempt >= self._retries:
            return None, f"its {rr.attempt} retries (faults.retries) are spent"
        if rr.req.params.n > 1:  # its choices' tokens differ: one migrated prompt cannot continue them all
            return None, f"a request of {rr.req.params.n} choices (n) is not migrated"
        origin = rr.origin
        done = len(rr.emitted)
        p = origin.params
        params = replace(p, max_tokens=p.max_tokens - done, min_tokens=max(0, p.min_tokens - done),
                         seed=p.seed if p.seed is not None else rr.stream_rid)
        req = GenerationRequest(origin.request_id, tuple(origin.prompt_ids) + tuple(rr.emitted), params, origin.cache_salt)
        nxt = self._table.new_record(req, rr.queue)
        nxt.origin, nxt.client_rid, nxt.attempt = origin, rr.stream_rid, rr.attempt + 1
        nxt.emitted, nxt.base_tokens = list(rr.emitted), done
        nxt.pe_side_only = rr.pe_side_only or (lost is rr.de and rr.side is ReadSide.DECODE)
        rr.successor = nxt
        self._table.metrics.migrated(rr.stream_rid)
        return nxt, ""

    def fail(self, rr: RouterRequest, why: str) -> None:
        """End the client's stream with an error naming the cause (exactly once)."""
        if not rr.failed:
            rr.end(Stream.FAILED)
            self._table.metrics.failed(rr.stream_rid)
            rr.queue.put_nowait(ServiceUnavailable(f"the request failed: {why}"))
