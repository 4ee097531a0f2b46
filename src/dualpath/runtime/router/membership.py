"""Which engine holds which place, which are alive, and what the router does when one leaves or a
successor comes back. The request side of a loss (migrate, requeue, fail) is recovery.py's; the
two talk through `RequestSide`, three calls, so neither reaches into the router.

An engine is lost (`engine_lost`, on the router's event loop, once per engine):
  0. How: its process exits (the cluster's exit watch, one host; a Ray actor's death, deploy/ray),
     it says it is leaving (`Leaving`, on SIGTERM: `on_leaving`), or it misses its heartbeats
     (`check_heartbeats`).
  1. Fence: liveness.py marks the engine down for good and the cluster kills it (`on_fence`); every
     surviving engine hears `EngineDown` (a PE forward waiting for that DE's layers goes on).
  2. The request side recovers its requests (`RequestSide.engine_lost`, recovery.py), told whether
     the cluster can still serve: every role has a live engine, or a successor may come (step 5).
A place is taken again (a joined engine, engine/join.py, that restarts: a Ray actor Ray restarted
after its process died, deploy/ray/engines.py), so a cluster heals instead of running one engine
short for good:
  3. Offer (`offer_place`, on a `Join`): the place asked for if it is free, else the lowest free
     place of the role: first one never taken, then one whose holder was fenced. A fenced place is
     offered under the next incarnation (the last one's + 1): the Welcome carries it, the successor
     names it in every remote-write hello, so its peers tell it from the fenced process.
  4. Hello (`on_hello`): a place never taken is admitted as at start-up; a fenced place offered
     under incarnation k is re-admitted (`readmit`): liveness.py marks it alive under k, its node's
     buffer ledger starts afresh (recovery.py freed every region on the old one), every other
     live engine hears `EngineUp` (it waits for that engine's layers again; the remote-write fence
     keeps refusing the old incarnation), and the request side moves its queued requests to a
     scheduler over the live engines, the successor among them (`RequestSide.successor_joined`).
     A Hello for a live place (a duplicate) changes nothing.
  5. Waiting for a restart (`faults.restart_wait_s` > 0, a cluster whose engines restart): when a
     role loses its last engine, its requests are not failed at once but wait, unscheduled, for a
     successor; new requests join them (`restart_pending`). If none is re-admitted within the
     wait, the request side ends each waiting request with `ServiceUnavailable` naming the cause
     (`RequestSide.wait_over`), and new ones get a 503.
So an in-flight request of a dead engine ends within the failure's detection (process exit: at
once; a frozen engine: the heartbeat timeout) plus `faults.restart_wait_s`: its tokens, or an error.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Protocol

from ...config import RuntimeConfig
from ..clock import Clock
from ..protocol import HEARTBEATS_PER_TIMEOUT, EngineDown, EngineRole, EngineUp, Hello, Join, Leaving
from ..transport.channel import Outbox
from ..transport.shm import SlotLedger
from .liveness import Liveness, describe_down, engine_health
from .state import EngineState


class RequestSide(Protocol):
    """What membership asks of the router's requests (recovery.py's `Recovery`)."""

    def engine_lost(self, lost: EngineState, why: str, servable: bool) -> None:
        """Migrate, requeue or fail every request that used `lost` (steps 2-4 of recovery.py)."""

    def successor_joined(self) -> None:
        """Every role is served again: queued requests go to a scheduler over the live engines."""

    def wait_over(self, why: str) -> None:
        """No successor came in time: every waiting request ends with an error naming `why`."""


class Membership:
    def __init__(self, cfg: RuntimeConfig, clock: Clock, token: bytes | None, full_block_bytes: int) -> None:
        self._num_prefill, self._num_decode = cfg.num_prefill, cfg.num_decode
        self._restart_wait_s = cfg.faults.restart_wait_s
        self._beat_s = cfg.faults.heartbeat_timeout_s / HEARTBEATS_PER_TIMEOUT
        self._clock, self._token, self._full_block_bytes = clock, token, full_block_bytes
        self.engines: dict[int, EngineState] = {}
        self.buffers: dict[int, SlotLedger] = {}  # node -> its host buffer's slots, from the engine's Hello
        self.liveness = Liveness(cfg.faults.heartbeat_timeout_s)
        self.offered: dict[int, int] = {}  # engine -> incarnation offered to a joining engine, before its Hello
        self.restart_deadline_s: float | None = None  # a role short of engines waits for a successor until (step 5)
        self.requests: RequestSide | None = None  # the router's recovery, set once it is built
        self.on_fence: Callable[[int], None] = lambda engine: None  # the cluster kills a fenced engine
        self.on_join: Callable[[Join], None] = lambda msg: None  # the cluster welcomes a joining engine
        self.watch: asyncio.TimerHandle | None = None  # the next heartbeat check

    @property
    def expected_engines(self) -> int:
        return self._num_prefill + self._num_decode

    def live_engines(self) -> list[EngineState]:
        return [e for e in self.engines.values() if self.liveness.is_alive(e.engine)]

    def servable(self) -> bool:
        """Every role has a live engine."""
        return {e.role for e in self.live_engines()} == {EngineRole.PREFILL, EngineRole.DECODE}

    def health(self) -> dict:
        return engine_health(self.engines, self.liveness)

    def describe_down(self) -> str:
        return describe_down(self.engines, self.liveness)

    # --- 0-2. losing an engine -------------------------------------------------------------------
    def on_leaving(self, msg: Leaving) -> None:
        """An engine told to end (SIGTERM, engine/leave.py) says so: lost now, not a heartbeat timeout
        later. A message from an earlier holder of the place (a restarted engine's) is ignored."""
        if msg.incarnation == self.liveness.incarnation.get(msg.engine, 0):
            self.engine_lost(msg.engine, "killed by SIGTERM")  # as the exit watch says it (liveness.exit_cause)

    def check_heartbeats(self) -> None:
        """Fence every engine silent for longer than the heartbeat timeout (liveness.py step 3); again
        every beat interval, on the router's loop, until the router stops."""
        for engine, silent_s in self.liveness.overdue(list(self.engines), self._clock.now_s()):
            self.engine_lost(engine, f"sent no heartbeat for {silent_s:.1f} s (frozen)")
        self.watch = asyncio.get_running_loop().call_later(self._beat_s, self.check_heartbeats)

    def engine_lost(self, engine: int, cause: str) -> None:
        """Fence `engine` and have its requests recovered (steps 1-2); idempotent."""
        if not self.liveness.fence(engine, cause):
            return
        self.on_fence(engine)
        lost = self.engines.get(engine)
        if lost is None:  # before its Hello: the start-up reports it
            return
        for e in self.live_engines():
            e.outbox.send(EngineDown(engine, self.liveness.incarnation.get(engine, 0)))
        servable = self.servable() or self.restart_pending()  # step 5: a role short may still wait
        assert self.requests is not None
        self.requests.engine_lost(lost, f"{lost.role} engine {engine} {cause}", servable)

    def restart_pending(self) -> bool:
        """A role short of engines may still get a successor in time (step 5): the first call after
        the loss starts the wait and its timer."""
        if self._restart_wait_s <= 0:
            return False
        now_s = self._clock.now_s()
        if self.restart_deadline_s is None:
            self.restart_deadline_s = now_s + self._restart_wait_s
            asyncio.get_running_loop().call_later(self._restart_wait_s, self._restart_overdue)
        return now_s < self.restart_deadline_s

    def _restart_overdue(self) -> None:
        if self.servable() or self.restart_deadline_s is None or self.requests is None:
            return
        self.requests.wait_over(f"{self.describe_down()}; no successor joined within "
                                f"faults.restart_wait_s ({self._restart_wait_s:g} s)")

    # --- 3-4. a place taken again ------------------------------------------------------------------
    def role_ids(self, role: EngineRole) -> range:
        n = self._num_prefill
        return range(n) if role == EngineRole.PREFILL else range(n, n + self._num_decode)

    def offer_place(self, role: EngineRole, wanted: int = -1) -> tuple[int, int, str]:
        """(engine id, incarnation, "") for a joining `role` engine, or (-1, 0, why not). Step 3."""
        ids = self.role_ids(role)
        fresh = [e for e in ids if e not in self.engines and e not in self.offered]
        fenced = [e for e in ids if e in self.engines and not self.liveness.is_alive(e)]
        free = fresh + [e for e in fenced if e not in self.offered]
        if wanted in fresh or wanted in fenced:  # asked for by name: re-offered even while offered
            engine = wanted  # (a successor that restarted again before its Hello)
        elif free:
            engine = free[0]
        else:
            return -1, 0, f"every {role} place of {self._num_prefill}P{self._num_decode}D is taken"
        incarnation = 0
        if engine in self.engines:
            incarnation = max(self.liveness.incarnation.get(engine, 0), self.offered.get(engine, 0)) + 1
        self.offered[engine] = incarnation
        return engine, incarnation, ""

    def on_hello(self, msg: Hello) -> None:
        """Step 4: admit, re-admit, or ignore a Hello."""
        engine = msg.engine
        if engine not in self.engines:
            self.liveness.incarnation[engine] = self.offered.pop(engine, 0)
            self._admit(msg)
        elif not self.liveness.is_alive(engine) and engine in self.offered:
            self._readmit(msg, self.offered.pop(engine))
        # else: a duplicate from a live holder, or a fenced holder's late one: nothing changes

    def _admit(self, msg: Hello) -> None:
        """The router's record of the engine that said `msg`, its buffer's ledger beside it."""
        self.engines[msg.engine] = EngineState(
            msg.engine, EngineRole(msg.role), msg.endpoint, kv_capacity_tokens=msg.kv_capacity_tokens,
            prefill_tokens_per_s=msg.prefill_tokens_per_s, outbox=Outbox(msg.endpoint, token=self._token),
            data_endpoint=msg.data_endpoint)
        self.buffers[msg.engine] = SlotLedger(msg.buffer_segment, self._full_block_bytes, msg.buffer_slots)

    def _readmit(self, msg: Hello, incarnation: int) -> None:
        # the old record's outbox stays open: a finished attempt may still hold it (its sends reach no one)
        self.liveness.readmit(msg.engine, incarnation)
        self._admit(msg)
        for e in self.live_engines():
            if e.engine != msg.engine:
                e.outbox.send(EngineUp(msg.engine, incarnation))
        if self.servable() and self.requests is not None:
            self.restart_deadline_s = None
            self.requests.successor_joined()
