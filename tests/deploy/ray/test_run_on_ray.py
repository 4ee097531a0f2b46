"""`dualpath run TRACE --ray local` (runtime/apps/run.py): the same replay with the engines as Ray
actors that join the router over TCP gives the tokens of the run without Ray (slow: a local Ray
start and two clusters, ~40 s on 2 cores)."""

from __future__ import annotations

import json

import pytest

from cli_helpers import cli


@pytest.mark.slow
def test_a_trace_replayed_on_ray_gives_the_tokens_of_the_plain_run(tmp_path):
    pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
    traj = tmp_path / "traj.jsonl"
    assert cli("trace", "gen", "--max-len", "4k", "--agents", "2", "--seed", "5", "-o", str(traj)).returncode == 0
    out = {}
    for name, extra in (("plain", []), ("ray", ["--ray", "local"])):
        j = tmp_path / f"{name}.json"
        p = cli("run", str(traj), "--model", "tiny", "--limit", "2", "--max-len", "2048", "--json", str(j), *extra)
        assert p.returncode == 0, p.stderr[-3000:]
        out[name] = json.loads(j.read_text())
    assert out["ray"]["config"]["ray"] == "local"
    (plain,), (on_ray,) = out["plain"]["runs"], out["ray"]["runs"]
    assert on_ray["tokens_sha256"] == plain["tokens_sha256"] and on_ray["num_turns"] == plain["num_turns"] > 2
    assert on_ray["bytes"]["storage_to_prefill"] + on_ray["bytes"]["storage_via_decode"] > 0  # hits read
