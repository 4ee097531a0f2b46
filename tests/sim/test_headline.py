"""CI guards a paper-level number: DS 660B, 2P4D, MaxLen 64K, 1,024 agents, offline (Fig. 7's
first point, docs/paper.md §6.2). Basic's and DualPath's job completion times, and so the headline
ratio between them, must equal the recorded result (docs/results/ds660b_2p4d_64k_1024_seed1.json,
written by `dualpath sim --agents 1024 --pd 2P4D --max-len 64k --mode basic --mode dualpath --mode
oracle --json ...`) to 1e-9, with DualPath below Basic. A change that moves the headline fails here,
not only in `make test-slow`. One test per mode, about a minute of pure-Python simulation each, so
that `make test`'s two workers can take one each. (Oracle <= DualPath <= Basic is held on a smaller
storage-bound cluster in test_simulator.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dualpath.cli.sim import build_sim_config
from dualpath.sim.runner import run_modes

RECORDED = Path(__file__).resolve().parents[2] / "docs" / "results" / "ds660b_2p4d_64k_1024_seed1.json"
RECORDED_JCT_S = {r["mode"]: r["jct_s"] for r in json.loads(RECORDED.read_text())["runs"]}


@pytest.mark.parametrize("mode", ["basic", "dualpath"])
def test_ds660b_2p4d_64k_1024_agents_jct_is_the_recorded_one(mode):
    cfg = build_sim_config("ds-v3.2-660b", "2P4D", "64k", 1024, 1, None, None, 1.0, 1.0)  # `dualpath sim`'s defaults
    (run,) = run_modes(cfg, [mode])["runs"]
    assert run["jct_s"] == pytest.approx(RECORDED_JCT_S[mode], rel=1e-9, abs=0), mode


def test_the_recorded_headline_has_dualpath_below_basic():
    assert RECORDED_JCT_S["oracle"] <= RECORDED_JCT_S["dualpath"] < RECORDED_JCT_S["basic"]
