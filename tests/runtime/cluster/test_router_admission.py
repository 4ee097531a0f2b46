"""The router checks what no engine could serve before it queues it (InputError names the problem):
a token id outside the model's vocabulary would otherwise end the prefill engine that meets it,
and every request on it."""

from __future__ import annotations

import asyncio

import pytest

from dualpath.config import RuntimeConfig
from dualpath.errors import InputError
from dualpath.runtime.api import GenerationRequest, SamplingParams
from dualpath.runtime.router.router import Router


class _Clock:
    def now_s(self) -> float:
        return 0.0


def _router(tmp_path, vocab_size: int | None) -> Router:
    return Router(RuntimeConfig(), model_name="t", tokenizer=None, max_context_tokens=4096, eos_token_ids=(),
                  kv_bytes_per_token=1, full_block_bytes=64, store=None, endpoint=f"ipc://{tmp_path}/router",
                  clock=_Clock(), vocab_size=vocab_size)


def _admit(router: Router, prompt: tuple[int, ...]):
    async def go():
        return router.admit(GenerationRequest("r", prompt, SamplingParams(max_tokens=2)))
    return asyncio.run(go())


@pytest.mark.parametrize("prompt,bad", [((1, 300, 2), 300), ((-1, 5), -1), ((7, 299, 10_000), 10_000)])
def test_a_token_outside_the_vocabulary_is_refused_by_name(tmp_path, prompt, bad):
    router = _router(tmp_path, 300)
    with pytest.raises(InputError, match=rf"token id {bad} is outside the model's vocabulary \[0, 300\)"):
        _admit(router, prompt)
    assert not router.requests  # nothing was queued


def test_tokens_inside_the_vocabulary_are_queued(tmp_path):
    router = _router(tmp_path, 300)
    rr = _admit(router, (0, 150, 299))
    assert router.requests[rr.rid] is rr and list(router.unscheduled) == [rr]  # no engine yet: it waits
    stand_in = _router(tmp_path, None)  # no vocabulary given: not checked
    assert stand_in.requests[_admit(stand_in, (10_000,)).rid]
