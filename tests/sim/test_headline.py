"""CI guards a paper-level number: DS 660B, 2P4D, MaxLen 64K, 1,024 agents, offline (Fig. 7's
first point, docs/paper.md §6.2). The job completion times must equal the recorded result
(docs/results/ds660b_2p4d_64k_1024_seed1.json, written by
`dualpath sim --agents 1024 --pd 2P4D --max-len 64k --mode basic --mode dualpath --mode oracle
--json ...`) to 1e-9, and keep the paper's order: oracle <= dualpath <= basic. A change that moves
a headline fails here, not only in `make test-slow`. About a minute of pure-Python simulation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath.cli.sim import build_sim_config
from dualpath.sim.runner import run_modes

RECORDED = Path(__file__).resolve().parents[2] / "docs" / "results" / "ds660b_2p4d_64k_1024_seed1.json"


def test_ds660b_2p4d_64k_1024_agents_jct_is_the_recorded_one():
    recorded = {r["mode"]: r["jct_s"] for r in json.loads(RECORDED.read_text())["runs"]}
    cfg = build_sim_config("ds-v3.2-660b", "2P4D", "64k", 1024, 1, None, None, 1.0, 1.0)  # `dualpath sim`'s defaults
    jct = {r["mode"]: r["jct_s"] for r in run_modes(cfg, ["basic", "dualpath", "oracle"])["runs"]}
    for mode in ("basic", "dualpath", "oracle"):
        assert jct[mode] == pytest.approx(recorded[mode], rel=1e-9, abs=0), mode
    assert jct["dualpath"] / jct["basic"] == pytest.approx(recorded["dualpath"] / recorded["basic"], rel=1e-9, abs=0)
    assert jct["oracle"] <= jct["dualpath"] <= jct["basic"]
