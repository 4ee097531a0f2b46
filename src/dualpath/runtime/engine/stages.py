"""The engines' records of a request each walk a short path, written down once here with their
legal moves, as core/phase.py writes down the router's (which follows both engines' reports).

Prefill engine (prefill_request.py):
  LOADING   its hit is on the way: the PE reads it (PE read path) or waits for the DE's HitReady
  READY     its cached KV is in place (or there was none): in the batch queue, one or more forwards
  COMPUTED  its last chunk is computed and its first token sampled; its PD copies drain, then it ends
Decode engine (decode.py):
  READING   the DE reads its hit into this node's buffer (DE read path); a cancel waits for the read
  WAITING   for the PE's PromptReady (the prompt's KV in this node's buffer)
  LOADING   the prompt's KV is copied into the KV cache (H2D)
  RUNNING   in the continuous batch
  FINISHING no more steps: its copies (the D2H of blocks it persists) drain, then it is released
A cancel (`cancelled`, beside the stage) ends the request at the next stage where nothing in
flight still touches it; a request that finishes before it runs (one token, or cancelled while
waiting) skips to FINISHING.
"""

from __future__ import annotations

import enum

from ...core.phase import IllegalTransition


class PrefillStage(enum.Enum):
    LOADING = 1
    READY = 2
    COMPUTED = 3


class DecodeStage(enum.Enum):
    READING = 1
    WAITING = 2
    LOADING = 3
    RUNNING = 4
    FINISHING = 5


PREFILL_MOVES: dict[PrefillStage, frozenset[PrefillStage]] = {
    PrefillStage.LOADING: frozenset({PrefillStage.READY}),
    PrefillStage.READY: frozenset({PrefillStage.COMPUTED}),
    PrefillStage.COMPUTED: frozenset(),
}

DECODE_MOVES: dict[DecodeStage, frozenset[DecodeStage]] = {
    DecodeStage.READING: frozenset({DecodeStage.WAITING}),
    DecodeStage.WAITING: frozenset({DecodeStage.LOADING, DecodeStage.FINISHING}),
    DecodeStage.LOADING: frozenset({DecodeStage.RUNNING, DecodeStage.FINISHING}),
    DecodeStage.RUNNING: frozenset({DecodeStage.FINISHING}),
    DecodeStage.FINISHING: frozenset(),
}


def moved(moves: dict, old: enum.Enum, new: enum.Enum) -> enum.Enum:
    """`new` if old -> new is one of `moves`, else IllegalTransition."""
    if new not in moves[old]:
        raise IllegalTransition(f"{old.name} -> {new.name} is not a legal stage move")
    return new
