import pytest

from dualpath.core.phase import LEGAL_TRANSITIONS, IllegalTransition, Phase, check_transition


def test_the_full_path_is_legal():
    path = [Phase.QUEUED, Phase.PE_ASSIGNED, Phase.READING, Phase.PREFILL_READY, Phase.PREFILLING,
            Phase.PREFILL_READY, Phase.PREFILLING, Phase.KV_TO_DECODE, Phase.DECODING, Phase.FINISHED]
    for a, b in zip(path, path[1:]):
        assert check_transition(a, b) is b


@pytest.mark.parametrize("a,b", [(Phase.QUEUED, Phase.PREFILLING), (Phase.DECODING, Phase.PREFILLING),
                                 (Phase.FINISHED, Phase.QUEUED), (Phase.READING, Phase.DECODING)])
def test_illegal_transitions_raise(a, b):
    with pytest.raises(IllegalTransition):
        check_transition(a, b)


def test_every_phase_reaches_finished():
    for start in Phase:
        seen, frontier = {start}, [start]
        while frontier:
            p = frontier.pop()
            for q in LEGAL_TRANSITIONS[p]:
                if q not in seen:
                    seen.add(q)
                    frontier.append(q)
        assert Phase.FINISHED in seen
