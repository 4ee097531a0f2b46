"""`dualpath chaos` (runtime/apps/chaos.py): bad input is one line and exit 2; a scenario on a real
2P2D cluster (tiny model) ends every request finished with the reference's tokens or errored."""

from __future__ import annotations

import json
import subprocess

import pytest
from cli_helpers import cli, cli_here

from dualpath.runtime.apps.chaos import SCENARIOS, parse_scenarios


def _cli(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return cli("chaos", *args, timeout=timeout)


def test_the_matrix_and_bad_input():
    assert len(SCENARIOS) == 12 and parse_scenarios(["all"]) == list(SCENARIOS)
    assert {s.split("-")[0] for s in SCENARIOS} == {"pe", "de"} and {s.split("-")[1] for s in SCENARIOS} == {"kill", "term", "stop"}
    for args, needle in ((("--scenario", "de-kill-lunch"), "unknown scenario"), (("--policy", "pray"), "--policy"),
                         (("--requests", "0"), "positive")):
        p = cli_here("chaos", *args)
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_a_frozen_decode_engine_loses_nothing_and_changes_no_token(tmp_path, policy):
    out = tmp_path / "c.json"
    p = _cli("--scenario", "de-stop-decode", "--policy", policy, "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    (r,) = json.loads(out.read_text())["results"]
    assert r["fired"] and r["requests"] == 4 and r["lost"] == 0 and r["wrong_tokens"] == 0
    assert r["finished"] + r["errored"] == 4
    if policy == "recompute":
        assert r["finished"] == 4  # the other DE takes the victim's requests
    else:
        assert r["errored"] >= 1  # the victim's requests end with the error the client sees
