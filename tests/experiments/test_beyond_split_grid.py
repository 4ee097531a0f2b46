"""`dualpath repro --only beyond` at quick scale (experiments/beyond.py): every grid point and mode
is in its JSON, the runs obey what the simulator guarantees, split reads move dualpath's bytes,
the goal verdicts follow from the numbers, and the docs block renders the JSON. One quick run per
module (56 simulations of 16 agents)."""

from __future__ import annotations

import json
import math
import shutil

import pytest

from dualpath.costmodel.models import get_model
from dualpath.docs.blocks.beyond import BEYOND_JSON, beyond
from dualpath.docs.results import Loaded, Results
from dualpath.experiments import beyond as experiment
from dualpath.experiments.common import RECHECK_SEEDS, Context
from dualpath.experiments.suite import resolve_names, run_suite

from recheck_helpers import recheck_first_failing

# Total hit bytes are sums of integer byte counts (whole tokens times KV bytes per token), exact in
# float below 2**53 bytes; two modes differ only in how the sum is cut and ordered. One block of
# the smallest model (64 tokens of DS 27B's KV) is over 1e-6 of any quick point's total, so this
# tolerance only forgives rounding, never a block read twice or lost.
BYTES_REL_TOL = 1e-9


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("beyond")
    [output] = run_suite(Context(out, scale="quick", seed=1), resolve_names(["beyond"]))
    return out, json.loads((out / "beyond.json").read_text()), output


def _finite(x) -> bool:
    return x is not None and math.isfinite(x)


def test_beyond_is_opt_in():
    assert "beyond" not in resolve_names(None)
    assert resolve_names(["fig8,beyond"]) == ["fig8", "beyond"]


def test_every_grid_point_has_every_mode(quick):
    out, data, output = quick
    points = experiment.points(Context(out, scale="quick"))
    rows = data["table"]
    assert [r["point"] for r in rows] == [p.label for p in points] and len(set(r["point"] for r in rows)) == len(rows)
    waiting = [r for r in rows if r["aps"] is not None]  # the unbalanced clusters again, agents arriving and waiting
    assert len(waiting) == 4 and all(r["unbalanced"] and r["tool_time_s"] == experiment.WAITING_TOOL_TIME_S
                                     and r["aps"] == experiment.WAITING_APS for r in waiting)
    assert all(r["aps"] is None and r["tool_time_s"] == 0 for r in rows[:len(rows) - 4])  # the offline grid first
    assert {r["pd"] for r in rows} == {"1P1D", "1P2D", "2P1D", "2P4D"}
    assert {r["max_len"] for r in rows} == {32768, 65536} and {r["model"] for r in rows} == {"ds-27b", "ds-v3.2-660b"}
    assert any(r["unbalanced"] and r["pd"] == "2P1D" and r["prefill_snic_scale"] == 0.5 for r in rows)
    for r in rows:
        assert list(r["modes"]) == list(experiment.MODES) and set(r["runs"]) == set(experiment.MODES)
        for m, x in r["modes"].items():
            assert all(_finite(x[k]) and x[k] > 0 for k in ("jct_s", "ttft_p50_s", "ttft_p99_s", "tpot_mean_s")), (r["point"], m)
            assert x["ttft_p50_s"] <= x["ttft_p99_s"]
            assert x["jct_over_dualpath"] == pytest.approx(x["jct_s"] / r["modes"]["dualpath"]["jct_s"])
            assert x["binding"] in x["utilisation"]
    assert data["headlines"] == [] and data["num_sims"] == len(rows) * len(experiment.MODES)
    assert (out / "beyond.png").stat().st_size > 5000
    assert f"## {output.title}" in (out / "report.md").read_text()


def test_the_oracle_reads_nothing(quick):
    """What holds by construction: the oracle's reads are free (sim/kv_io.py: FreeKvIo reads no
    token), so no byte crosses a SNIC on either path and no turn waits for a read; every other mode
    reads and waits. Its JCT is not a lower bound of the others': it runs dualpath's heuristic
    scheduler, whose choices change with the timings (the full run has DS 660B 2P4D 32K at 512
    agents finish in 946 s with the oracle, 944 s with dualpath and 928 s with split reads)."""
    _, data, _ = quick
    for r in data["table"]:
        oracle = r["modes"]["oracle"]
        assert oracle["pe_path_bytes"] == oracle["de_path_bytes"] == oracle["ttft_read_mean_s"] == 0
        assert oracle["utilisation"]["pe_snic_read"] == oracle["utilisation"]["de_snic_read"] == 0
        assert all(x["ttft_read_mean_s"] > 0 for m, x in r["modes"].items() if m != "oracle"), r["point"]


def test_split_reads_move_dualpaths_hit_bytes(quick):
    _, data, _ = quick
    for r in data["table"]:
        kv_bytes_per_token = get_model(r["model"]).kv_bytes_per_token
        modes = r["modes"]
        dual, split, basic = modes["dualpath"], modes["dualpath+split"], modes["basic"]
        assert split["cached_tokens"] == dual["cached_tokens"] == basic["cached_tokens"] > 0
        hit_bytes = dual["cached_tokens"] * kv_bytes_per_token
        for x in (dual, split, basic):
            assert x["pe_path_bytes"] + x["de_path_bytes"] == pytest.approx(hit_bytes, rel=BYTES_REL_TOL), r["point"]
        assert basic["de_path_bytes"] == 0 and dual["num_split_reads"] == 0
    unbalanced = [r["modes"]["dualpath+split"] for r in data["table"] if r["unbalanced"]]
    assert unbalanced and all(x["num_split_reads"] > 0 for x in unbalanced)


def test_goal_verdicts_follow_from_the_numbers(quick):
    _, data, _ = quick
    for r in data["table"]:
        split, dual = r["modes"]["dualpath+split"], r["modes"]["dualpath"]
        jct, ttft_p99 = split["jct_s"] / dual["jct_s"], split["ttft_p99_s"] / dual["ttft_p99_s"]
        g = r["goal"]
        assert g["split_jct_over_dualpath"] == pytest.approx(jct) and g["split_ttft_p99_over_dualpath"] == pytest.approx(ttft_p99)
        assert g["no_regression"] == (jct <= 1.01)
        assert g["unbalanced_gain"] == ((jct <= 0.95 or ttft_p99 <= 0.85) if r["unbalanced"] else None)
        assert g["holds"] == (g["no_regression"] and g["unbalanced_gain"] is not False)
    for r in data["table"]:  # a point over the no-regression line is run again on other seeds, only such a point
        recheck = r.get("recheck")
        assert (recheck is None) == r["goal"]["no_regression"], r["point"]
        if recheck is not None:
            assert recheck["seeds"] == [2, 3, 4, 5] and len(recheck["split_jct_over_dualpath"]) == RECHECK_SEEDS
            assert recheck["num_no_regression"] == sum(x <= 1.01 for x in recheck["split_jct_over_dualpath"])
            assert all(_finite(x) and x > 0 for x in recheck["split_jct_over_dualpath"])
    goals = data["goals"]
    assert goals["num_points"] == len(data["table"]) and goals["num_hold"] == sum(r["goal"]["holds"] for r in data["table"])
    assert data["verdict"].startswith(f"split-read goals hold on {goals['num_hold']} of {goals['num_points']} grid points")


def _modes(jct: float, ttft_p99: float) -> dict:
    return {"dualpath+split": {"jct_over_dualpath": jct, "ttft_p99_over_dualpath": ttft_p99}}


@pytest.mark.parametrize("jct,ttft_p99,unbalanced,holds", [
    (1.009, 1.5, False, True), (1.011, 0.5, False, False), (0.949, 1.0, True, True), (0.96, 0.849, True, True),
    (0.96, 0.851, True, False), (1.011, 0.5, True, False), (float("nan"), 0.5, False, False),
])
def test_goal_thresholds(jct, ttft_p99, unbalanced, holds):
    assert experiment.goal(unbalanced, _modes(jct, ttft_p99))["holds"] is holds


def test_the_docs_block_renders_the_json(quick, tmp_path):
    out, data, _ = quick
    (tmp_path / "beyond").mkdir()
    shutil.copy(out / "beyond.json", tmp_path / BEYOND_JSON)
    text = beyond(Results(Loaded(tmp_path), "beyond", (BEYOND_JSON,)))
    goals = data["goals"]
    assert f"**{goals['num_hold']} of {goals['num_points']} grid points**" in text
    assert all(f"| {r['point']} |" in text for r in data["table"])


def test_a_point_over_the_line_is_run_again_on_other_seeds(tmp_path):
    """`recheck` on a table whose first point is marked over the line (the full run's 2P1D 32K with
    half-rate PE SNICs was, at 1.016, and 0.994-0.998 on seeds 2-5): its ratios are split's JCT over
    dualpath's simulated on each other seed, and no other point is run again."""
    points = experiment.points(Context(tmp_path, scale="quick"))
    point = points[0]
    got = recheck_first_failing(tmp_path, len(points), "no_regression", experiment.recheck)
    for seed, x in zip(got["seeds"], got["split_jct_over_dualpath"]):
        other = Context(tmp_path, scale="quick", seed=seed)
        want = (experiment.simulate(other, point.spec(experiment.SPLIT))["jct_s"]
                / experiment.simulate(other, point.spec(experiment.BASELINE))["jct_s"])
        assert x == pytest.approx(want, rel=1e-12)
    assert len(set(got["split_jct_over_dualpath"])) > 1  # four workloads, not one run four times
