"""The lifecycle of one request (one agent turn), written down once for both worlds.

Numbered path (docs/structure.md, "One request's path"):
  1. QUEUED        arrived, waiting in the global FIFO queue for a prefill engine (PE), or (prefilled
                   on its DE, `+selective`) in the DE queue
  2. PE_ASSIGNED   PE chosen (Algorithm 1), waiting for a decode engine (DE) with HBM room
  3. READING       PE, DE and read side chosen; hit KV moving storage -> read-side host buffer
  4. PREFILL_READY hit KV in a host buffer (or nothing to read), waiting in the PE's batch queue
  5. PREFILLING    in one or more PE forward batches (chunked prefill may take several)
  6. KV_TO_DECODE  prompt KV completing in the DE buffer, then copied into DE HBM
  7. DECODING      in the DE's continuous batch
  8. FINISHED      all requested tokens generated; new full blocks persisted by the DE

Phases may be skipped forward only along `LEGAL_TRANSITIONS` (READING is skipped when there
is nothing to read; DECODING when the turn generates a single token, which prefill produces).
A request prefilled on its DE (`+selective`, core/policy/local.py) has no PE: QUEUED goes to
READING or PREFILL_READY once its DE is chosen, and PREFILLING (on the DE) straight to DECODING.
"""

from __future__ import annotations

import enum

from mypy_extensions import mypyc_attr


class Phase(enum.IntEnum):
    QUEUED = 1
    PE_ASSIGNED = 2
    READING = 3
    PREFILL_READY = 4
    PREFILLING = 5
    KV_TO_DECODE = 6
    DECODING = 7
    FINISHED = 8


LEGAL_TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.QUEUED: frozenset({Phase.PE_ASSIGNED, Phase.READING, Phase.PREFILL_READY}),  # the last two: +selective
    Phase.PE_ASSIGNED: frozenset({Phase.READING, Phase.PREFILL_READY}),
    Phase.READING: frozenset({Phase.PREFILL_READY}),
    Phase.PREFILL_READY: frozenset({Phase.PREFILLING}),
    Phase.PREFILLING: frozenset({Phase.PREFILL_READY, Phase.KV_TO_DECODE, Phase.DECODING, Phase.FINISHED}),  # back: next chunk; the last two: +selective
    Phase.KV_TO_DECODE: frozenset({Phase.DECODING, Phase.FINISHED}),  # FINISHED: gen_tokens == 1
    Phase.DECODING: frozenset({Phase.FINISHED}),
    Phase.FINISHED: frozenset(),
}


@mypyc_attr(native_class=False)  # compiled (_build.py): an exception stays a Python class
class IllegalTransition(RuntimeError):
    pass


def check_transition(old: Phase, new: Phase) -> Phase:
    """Return `new` if old -> new is legal, else raise IllegalTransition."""
    if new not in LEGAL_TRANSITIONS[old]:
        raise IllegalTransition(f"{old.name} -> {new.name} is not a legal phase transition")
    return new
