"""What each engine is charged for the requests the router placed on it, and what it gets back.

A scheduling pass books a request's load on its PE (sequences, prompt tokens) and on its DE
(sequences, tokens, the HBM reservation for the whole turn) and charges its hit's tokens to the
read side's queue (`assigned_*`); the request's progress releases each (`*_released`,
`read_ended`), also when an engine dies (recovery.py). The scheduler keeps its own ledgers of the
same loads: a release from a live engine is told to it. `check_ledgers` (state.py) holds every
engine's charges equal to the sums over live requests.
"""

from __future__ import annotations

from typing import Callable

from ...core.phase import Phase
from ...core.scheduler import GlobalScheduler
from ...core.snapshot import ReadSide
from .liveness import Liveness
from .state import EngineState, RouterRequest


class Bookings:
    def __init__(self, liveness: Liveness, scheduler: Callable[[], GlobalScheduler | None]) -> None:
        self._liveness = liveness
        self._scheduler = scheduler  # the router's current one (a mode switch builds another)

    def assigned_pe(self, rr: RouterRequest, pe: EngineState) -> None:
        rr.pe = pe
        rr.advance(Phase.PE_ASSIGNED)
        pe.num_seqs += 1
        pe.num_tokens += rr.qview.num_tokens

    def assigned_de(self, rr: RouterRequest, de: EngineState, side: ReadSide, read_tokens: int, recompute: bool) -> None:
        rr.de = de
        de.num_seqs += 1
        de.num_tokens += rr.total_tokens
        de.kv_reserved_tokens += rr.total_tokens
        rr.side = ReadSide.PREFILL if rr.pe_side_only else side  # (a DE-path retry: recovery.py)
        rr.read_charged_tokens, rr.recompute = read_tokens, recompute  # recompute: a slow store's hit is a miss
        rr.side_engine.read_queue_tokens += read_tokens

    def read_ended(self, rr: RouterRequest) -> None:
        rr.side_engine.read_queue_tokens -= rr.read_charged_tokens
        rr.read_charged_tokens = 0

    def pe_released(self, rr: RouterRequest) -> None:
        rr.pe.num_seqs -= 1
        rr.pe.num_tokens -= rr.qview.num_tokens
        scheduler = self._scheduler()
        if self._liveness.is_alive(rr.pe.engine) and scheduler is not None:  # a fenced engine has left the scheduler
            scheduler.pe_released(rr.pe.engine, rr.pe.num_tokens)

    def de_released(self, rr: RouterRequest) -> None:
        rr.de.num_seqs -= 1
        rr.de.num_tokens -= rr.total_tokens
        rr.de.kv_reserved_tokens -= rr.total_tokens
        scheduler = self._scheduler()
        if self._liveness.is_alive(rr.de.engine) and scheduler is not None:
            scheduler.de_released(rr.de.engine, rr.de.num_tokens)
