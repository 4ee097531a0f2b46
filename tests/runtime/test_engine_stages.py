"""The engines' request stages (runtime/engine/stages.py): every path the engines take is a chain of
legal moves, and a move off the path raises (an engine bug fails loudly, not with a request lost)."""

from __future__ import annotations

import itertools

import pytest

from dualpath.core.phase import IllegalTransition
from dualpath.runtime.engine.stages import DECODE_MOVES, PREFILL_MOVES, DecodeStage, PrefillStage, moved

R, W, L, RUN, F = DecodeStage.READING, DecodeStage.WAITING, DecodeStage.LOADING, DecodeStage.RUNNING, DecodeStage.FINISHING


@pytest.mark.parametrize("path", [
    (R, W, L, RUN, F),  # DE read path, decoded to the end (or cancelled while running)
    (W, L, RUN, F),  # PE read path, or no hit
    (W, L, F),  # one token (the PE's), or cancelled during the H2D copy
    (W, F),  # cancelled before the PE's prompt came
    (R, W, F),  # cancelled during its read: ends when the read does
])
def test_every_decode_path_is_a_chain_of_legal_moves(path):
    stage = path[0]
    for nxt in path[1:]:
        stage = moved(DECODE_MOVES, stage, nxt)
    assert stage is path[-1]


def test_the_prefill_path_is_one_chain_and_every_other_move_raises():
    stage = PrefillStage.LOADING
    for nxt in (PrefillStage.READY, PrefillStage.COMPUTED):
        stage = moved(PREFILL_MOVES, stage, nxt)
    legal = {(a, b) for a, bs in PREFILL_MOVES.items() for b in bs}
    assert legal == {(PrefillStage.LOADING, PrefillStage.READY), (PrefillStage.READY, PrefillStage.COMPUTED)}
    for a, b in itertools.product(PrefillStage, PrefillStage):
        if (a, b) not in legal:
            with pytest.raises(IllegalTransition, match=f"{a.name} -> {b.name}"):
                moved(PREFILL_MOVES, a, b)


def test_a_decode_request_never_runs_again_nor_skips_its_prompt():
    for bad in ((F, RUN), (RUN, L), (R, L), (W, RUN), (R, F), (L, W)):
        with pytest.raises(IllegalTransition):
            moved(DECODE_MOVES, *bad)
