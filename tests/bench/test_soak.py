"""`dualpath bench soak` at small scale: a real server (tiny model) under the whole mix, with
conversations short enough that salts change within the run; and its checks on made-up samples."""

from __future__ import annotations

import asyncio

import pytest

from dualpath.bench.soak import checks, run_soak, window_row
from dualpath.bench.soak_clients import Outcome

pytest.importorskip("httpx")


def test_a_short_soak_answers_every_request_and_keeps_tenants_apart(tmp_path):
    r = asyncio.run(run_soak("tiny", minutes=0.3, sample_s=6.0, clients=2, capacity_s=4.0, seed=3,
                             log_path=tmp_path / "serve.log", context_limit_tokens=320))
    c = r["checks"]
    assert c["responses_5xx"] == 0 and c["lost"] == 0 and c["incomplete_200"] == 0, c
    assert c["server_inflight_after_drain"] == 0
    assert c["by_status"].get("200", 0) > 20 and c["by_status"].get("aborted", 0) > 0  # disconnects and cancels ran
    assert c["first_turns_under_a_new_salt"] > 0 and c["cached_across_salts"] == 0  # salts changed; nothing crossed
    assert c["hits_under_the_same_salt"] > 0  # ... while a conversation's own salt hits its stored prefix
    kinds = {o["kind"] for o in r["outcomes"]}
    assert kinds == {"stream", "plain", "stream_logprobs", "plain_logprobs", "stream_n", "plain_n", "disconnect", "cancel"}
    assert len(r["samples"]) >= 4 and all(s["rss_bytes"] > s["private_bytes"] > 0 and s["open_fds"] > 0 for s in r["samples"])
    assert 0 < r["rate_per_s"] < r["capacity_per_s"]


def _samples(rss: list[int], fds: list[int]) -> list[dict]:
    return [window_row([], 0, t, m, m // 2, f) for t, (m, f) in enumerate(zip(rss, fds))]


def test_the_checks_catch_growth_errors_and_leaks():
    ok = [Outcome("stream", 1.0, status=200, complete=True, cached_tokens=64)]
    flat = _samples([100] * 8, [50] * 8)
    assert checks(ok, flat, 60.0, 0)["passed"]
    assert not checks(ok, _samples([100] * 6 + [106, 106], [50] * 8), 60.0, 0)["passed"]  # RSS +6% after minute 5
    assert checks(ok, _samples([100] * 6 + [104, 104], [50] * 8), 60.0, 0)["passed"]
    assert not checks(ok, _samples([100] * 8, [50] * 6 + [70, 90]), 60.0, 0)["passed"]  # fds growing
    assert not checks(ok + [Outcome("plain", 2.0, status=500)], flat, 60.0, 0)["passed"]
    assert not checks(ok + [Outcome("plain", 2.0, lost=True)], flat, 60.0, 0)["passed"]
    assert not checks([Outcome("stream", 1.0, status=200, complete=True, cached_tokens=64, fresh_salt=True)],
                      flat, 60.0, 0)["passed"]  # a hit under a salt never used before
    assert not checks(ok, flat, 60.0, 1)["passed"]  # a request the server still holds
