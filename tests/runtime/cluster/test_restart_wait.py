"""A role left without engines waits `engine_restart_wait_s` for a successor (router/recovery.py
step 5, membership.py step 5), then ends its requests with a clear error, never a hang. On a local
1P1D cluster (tiny model) nothing restarts the killed DE, so every request in flight at the kill,
and one that arrives during the wait, ends with a 503 naming the dead engine and the wait, within
the wait plus the exit bound; after it a new request is refused at once."""

from __future__ import annotations

import asyncio
import time

import pytest

from dualpath.runtime.api import GenerationRequest, SamplingParams, ServiceUnavailable
from fault_harness import EXIT_BOUND_S, PROMPTS, Served, config, first_decoding_de, greedy, greedy_all

WAIT_S = 1.5  # short for the test; Ray clusters wait deploy/ray/engines.py: ENGINE_RESTART_WAIT_S (60 s)


@pytest.mark.slow  # a cluster of its own and 4 x 600 greedy tokens: ~25 s on the loaded 2-core VM
def test_requests_wait_for_a_successor_then_end_with_one_clear_error():
    served = Served(config({"faults.restart_wait_s": WAIT_S}))
    try:
        router = served.router
        seen: dict = {}

        async def kill_the_de():
            de, _ = await first_decoding_de(router)
            served.kill(de)
            seen["killed_at_s"] = time.monotonic()
            await asyncio.sleep(0.5)  # during the wait: accepted, queued for the successor
            seen["late"] = asyncio.create_task(greedy(router, 0))

        got = served.run(greedy_all(router, kill_the_de))
        ended_s = time.monotonic() - seen["killed_at_s"]
        late = served.run(asyncio.wait_for(seen["late"], 30))
        for tokens in [*got, late]:
            assert tokens[0] == "error", tokens[:3]
            assert "decode engine 1 killed by SIGKILL" in tokens[1]
            assert f"no successor joined within faults.restart_wait_s ({WAIT_S:g} s)" in tokens[1]
        assert WAIT_S - 0.2 <= ended_s <= WAIT_S + EXIT_BOUND_S
        params = SamplingParams(max_tokens=4, temperature=0)
        with pytest.raises(ServiceUnavailable, match="no engine can serve it"):
            served.on_loop(lambda: router.admit(GenerationRequest("after", PROMPTS[1], params)))
        assert served.on_loop(lambda: list(router.unscheduled)) == []
    finally:
        served.close()
