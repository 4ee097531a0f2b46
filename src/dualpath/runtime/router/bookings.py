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

    def assigned_de(self, rr: RouterRequest, de: EngineState, side: ReadSide, read_tokens: int, recompute: bool,
                    pe_part_tokens: int = 0) -> None:
        """`pe_part_tokens` > 0: a split read, the PE node charged with its part, `side` (DECODE) with the rest."""
        rr.de = de
        de.num_seqs += 1
        de.num_tokens += rr.total_tokens
        de.kv_reserved_tokens += rr.total_tokens
        rr.side = ReadSide.PREFILL if rr.pe_side_only and not rr.local else side  # (a DE-path retry: recovery.py)
        rr.recompute = recompute  # a slow store's hit is a miss
        rr.pe_part_tokens = 0 if rr.pe_side_only else pe_part_tokens
        self.hit_found(rr, read_tokens)

    def hit_found(self, rr: RouterRequest, hit_tokens: int) -> None:
        """Charge the read queues with `hit_tokens` (the pass's hit, then placement's: a persist may have
        landed or failed since): a split's PE part on the PE node (shorter if the hit is), the rest on the side's."""
        pe_part = min(rr.pe_part_tokens, hit_tokens)
        if pe_part or rr.pe_part_charged_tokens:
            assert rr.pe is not None
            rr.pe.read_queue_tokens += pe_part - rr.pe_part_charged_tokens
        rr.side_engine.read_queue_tokens += hit_tokens - pe_part - rr.read_charged_tokens
        rr.pe_part_tokens = rr.pe_part_charged_tokens = pe_part
        rr.read_charged_tokens = hit_tokens - pe_part

    def read_ended(self, rr: RouterRequest, engine: int | None = None) -> None:
        """`engine`'s read of `rr` ended (a split has one per node); None: every read of it."""
        if rr.pe_part_charged_tokens and (engine is None or engine != rr.side_engine.engine):
            assert rr.pe is not None
            rr.pe.read_queue_tokens -= rr.pe_part_charged_tokens  # a split's PE part
            rr.pe_part_charged_tokens = 0
        if engine is None or engine == rr.side_engine.engine:
            rr.side_engine.read_queue_tokens -= rr.read_charged_tokens
            rr.read_charged_tokens = 0

    @staticmethod
    def reading(rr: RouterRequest) -> bool:
        """A read of `rr` has not reported yet (a split's two: both must report)."""
        return bool(rr.read_charged_tokens or rr.pe_part_charged_tokens)

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
