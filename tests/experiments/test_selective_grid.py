"""`dualpath repro --only selective` at quick scale (experiments/selective.py): every point and mode
is in its JSON, the local fraction follows the rule (none without +selective, more with a higher
threshold), the goal verdicts follow from the numbers, and the docs block renders the JSON. One
quick run per module (32 simulations of 16 agents)."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from dualpath.core.policy.local import LOCAL_PREFILL_MAX_TOKENS_DEFAULT
from dualpath.costmodel.models import get_model
from dualpath.docs.blocks.beyond import SELECTIVE_JSON, selective
from dualpath.docs.results import Loaded, Results
from dualpath.experiments import selective as experiment
from dualpath.experiments.common import RECHECK_SEEDS, Context
from dualpath.experiments.suite import resolve_names, run_suite

from recheck_helpers import recheck_first_failing


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("selective")
    [output] = run_suite(Context(out, scale="quick", seed=1), resolve_names(["selective"]))
    return out, json.loads((out / "selective.json").read_text()), output


def test_selective_is_opt_in():
    assert "selective" not in resolve_names(None)


def test_every_point_has_every_mode_and_the_local_turns_follow_the_rule(quick):
    out, data, _ = quick
    rows = data["table"]
    assert [r["point"] for r in rows] == [p.label for p in experiment.grid(Context(out, scale="quick"))]
    assert {r["model"] for r in rows} == {"ds-27b", "ds-v3.2-660b"} and {r["max_len"] for r in rows} == {32768, 65536}
    for r in rows:
        assert set(r["modes"]) == set(experiment.MODES)
        kvb = get_model(r["model"]).kv_bytes_per_token
        for m, x in r["modes"].items():
            assert all(math.isfinite(x[k]) and x[k] > 0 for k in ("jct_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s"))
            assert (x["local_fraction"] > 0) == m.endswith("selective"), (r["point"], m)
            # every hit is read once, on one path or the other
            assert x["pe_path_bytes"] + x["de_path_bytes"] == pytest.approx(x["cached_tokens"] * kvb, rel=1e-9)
        assert r["modes"]["basic"]["de_path_bytes"] == 0 < r["modes"]["selective"]["de_path_bytes"]
    assert data["headlines"] == [] and (out / "selective.png").stat().st_size > 5000


def test_a_higher_threshold_keeps_more_turns_local(quick):
    _, data, _ = quick
    assert len(data["sweep"]) == 2
    for s in data["sweep"]:
        for m, xs in s["modes"].items():
            assert [x["threshold_tokens"] for x in xs] == list(experiment.THRESHOLDS)
            fractions = [x["local_fraction"] for x in xs]
            assert fractions == sorted(fractions) and fractions[0] < fractions[-1], (s["point"], m)
            main = next(r for r in data["table"] if r["point"] == s["point"])["modes"][m]
            assert xs[experiment.THRESHOLDS.index(LOCAL_PREFILL_MAX_TOKENS_DEFAULT)]["jct_s"] == main["jct_s"]  # the same run


def test_goal_verdicts_follow_from_the_numbers(quick):
    _, data, _ = quick
    for r in data["table"]:
        m = r["modes"]
        over = m["dualpath+selective"]["jct_s"] / min(m["dualpath"]["jct_s"], m["selective"]["jct_s"])
        assert r["goal"]["jct_over_better"] == pytest.approx(over) and r["goal"]["holds"] == (over <= 1.0)
    assert data["goals"]["num_hold"] == sum(r["goal"]["holds"] for r in data["table"])
    for r in data["table"]:  # a failing point is run again on other seeds, and only a failing one
        assert ("recheck" in r) == (not r["goal"]["holds"]), r["point"]
        if "recheck" in r:
            xs = r["recheck"]["jct_over_better"]
            assert len(xs) == RECHECK_SEEDS and r["recheck"]["num_hold"] == sum(x <= 1.0 for x in xs)
    nan = {"jct_s": float("nan")}
    assert not experiment.goal({"dualpath": {"jct_s": 1.0}, "selective": {"jct_s": 2.0}, "dualpath+selective": nan})["holds"]


def test_the_docs_block_renders_the_json(quick, tmp_path):
    out, data, _ = quick
    (tmp_path / "beyond").mkdir()
    shutil.copy(out / "selective.json", tmp_path / SELECTIVE_JSON)
    text = selective(Results(Loaded(tmp_path), "selective", (SELECTIVE_JSON,)))
    goals = data["goals"]
    assert f"**{goals['num_hold']} of {goals['num_points']} points**" in text
    assert all(f"| {r['point']} |" in text for r in data["table"])


def test_a_failing_point_is_run_again_on_other_seeds(tmp_path):
    """`recheck` on a table whose first point is marked failing (the full run's DS 27B 1P1D 64K
    was): its ratios are the goal's, dualpath+selective's JCT over the better of the other two,
    simulated on each other seed; no other point is run again."""
    points = experiment.grid(Context(tmp_path, scale="quick"))
    got = recheck_first_failing(tmp_path, len(points), "holds", experiment.recheck)
    for seed, x in zip(got["seeds"], got["jct_over_better"]):
        other = Context(tmp_path, scale="quick", seed=seed)
        jct = {m: experiment.simulate(other, points[0].spec(m))["jct_s"] for m in ("dualpath", "selective", "dualpath+selective")}
        assert x == pytest.approx(jct["dualpath+selective"] / min(jct["dualpath"], jct["selective"]), rel=1e-12)
    assert len(set(got["jct_over_better"])) > 1
