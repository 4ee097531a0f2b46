"""`dualpath plan --local` (plan/local.py) and its check against the runtime (bench/plan_local.py):
the shapes a budget allows, the CPUs shared as processor sharing at the predicted load, the two
worlds' verdicts on a pair of configurations."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from cli_helpers import cli_here
from dualpath.bench.plan_local import compare, order
from dualpath.core.request import TurnSpec
from dualpath.costmodel.models import TINY
from dualpath.errors import InputError
from dualpath.plan.local import LocalWorkload, local_shapes, plan_local, predict
from dualpath.workloads import Trajectory


def test_the_shapes_of_a_budget():
    assert local_shapes(3) == [(1, 1), (1, 2), (2, 1)]
    assert len(local_shapes(4)) == 6 and local_shapes(4)[-1] == (3, 1)
    for bad in (1, 9):
        with pytest.raises(InputError, match="--engines must be 2 to 8"):
            local_shapes(bad)


def _work(prefill_per_token_s: float) -> LocalWorkload:
    """Tiny's KV, a profile whose prefill costs `prefill_per_token_s` a token, 4 agents of 3 turns."""
    fit = SimpleNamespace
    profile = SimpleNamespace(prefill_fit=fit(fixed_s=0.005, per_item_s=prefill_per_token_s, per_key_s=1e-8),
                              decode_fit=fit(fixed_s=0.004, per_item_s=5e-4, per_key_s=1e-7, per_ctx_s=0.0))
    rates = SimpleNamespace(snic_bytes_per_s=200e6, cnic_bytes_per_s=1.6e9)
    trajs = [Trajectory(a, (TurnSpec(600, 8), TurnSpec(60, 8), TurnSpec(60, 8))) for a in range(4)]
    plan = SimpleNamespace(trajectories=trajs, rates=rates, calibration=SimpleNamespace(path=None, profile=profile))
    return LocalWorkload(plan, TINY.kv_bytes_per_token, "tiny")


def test_engines_beyond_the_cpus_slow_every_forward_by_the_busy_engines_over_the_cpus():
    work = _work(2e-3)  # compute-bound: the engines want more than one CPU between them
    alone = predict(work, (2, 1), "dualpath", cpus=16)
    shared = predict(work, (2, 1), "dualpath", cpus=1)
    assert alone["cpu_slowdown"] == 1.0 and alone["busy_engines"] > 1.0
    assert shared["cpu_slowdown"] > 1.0
    # at the fixed point the slowdown is the engines' busy fraction over the CPUs (within the 1% step)
    assert shared["cpu_slowdown"] == pytest.approx(shared["busy_engines"] / 1, rel=0.03)
    # compute-bound: the JCT stretches by the slowdown
    assert shared["predicted"]["jct_s"] / alone["predicted"]["jct_s"] == pytest.approx(shared["cpu_slowdown"], rel=0.03)
    assert shared["binding"] in ("prefill compute", "decode compute")
    assert shared["command"].split()[:4] == ["dualpath", "demo", "--pd", "2P1D"]


def test_the_ranking_is_by_predicted_jct_and_covers_every_shape_and_mode():
    ranked = plan_local(_work(2e-4), 3, ("basic", "dualpath"), cpus=16)
    assert sorted((c["pd"], c["mode"]) for c in ranked) == sorted(
        (pd, m) for pd in ("1P1D", "1P2D", "2P1D") for m in ("basic", "dualpath"))
    jcts = [c["predicted"]["jct_s"] for c in ranked]
    assert jcts == sorted(jcts)
    one = {c["mode"]: c["predicted"]["jct_s"] for c in ranked if c["pd"] == "1P1D"}
    two_pe = {c["mode"]: c["predicted"]["jct_s"] for c in ranked if c["pd"] == "2P1D"}
    assert two_pe["basic"] < one["basic"]  # two prefill engines: two SNICs and two forwards at a time


def test_a_verdict_is_an_order_only_beyond_the_tie_and_the_runs_range():
    assert order(10.0, 10.4) == "="  # 4%: a tie
    assert order(10.0, 11.0) == "<" and order(11.0, 10.0) == ">"
    assert order(10.0, 11.0, (9.0, 11.5), (10.5, 11.2)) == "="  # ranges overlap
    assert order(10.0, 11.0, (9.9, 10.1), (10.9, 11.1)) == "<"


def test_compare_counts_agreements_and_contradictions():
    def row(pd, mode, jct):
        return {"pd": pd, "mode": mode, "predicted": {"jct_s": jct}}

    predicted = [row("1P1D", "dualpath", 40.0), row("1P2D", "dualpath", 33.0), row("2P1D", "dualpath", 30.0)]
    runtime = {"1P1D dualpath": [39.0, 40.0], "1P2D dualpath": [29.0, 29.5], "2P1D dualpath": [33.0, 33.4]}
    c = compare(predicted, runtime)
    assert c["one_p_one_d_pairs"] == 2 and c["one_p_one_d_agree"] == 2  # 1P1D slower than both, in both worlds
    pair = next(p for p in c["pairs"] if {p["a"], p["b"]} == {"1P2D dualpath", "2P1D dualpath"})
    assert pair["contradiction"] and c["contradictions"] == 1 and c["agree"] == 2
    assert c["runtime_best"] == "1P2D dualpath"
    assert c["rows"][0]["error"] == pytest.approx(40.0 / 39.5 - 1)


@pytest.mark.parametrize("args, words", [
    (["demo", "--pd", "0P1D"], "at least one prefill and one decode"),
    (["demo", "--pd", "2P1D", "--testbed"], "--pd is not wired on the testbed"),
    (["bench", "plan-local", "--repeat", "0"], "--repeat must be at least 1"),
    (["bench", "plan-local", "--model", "gpt-9"], "the local preset knows"),
])
def test_local_planning_bad_input_is_one_error_line(args, words):
    r = cli_here(*args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr


def test_the_runtime_table_averages_snic_utilisation_per_role():
    from dualpath.cli.results import RUNTIME_COLUMNS

    cells = dict(RUNTIME_COLUMNS)
    snic = {"0": {"utilisation": 0.9}, "1": {"utilisation": 0.7}, "2": {"utilisation": 0.2}}
    two_pe = {"snic": snic, "engine_roles": {"0": "prefill", "1": "prefill", "2": "decode"}}
    assert (cells["SNIC util PE"](two_pe), cells["SNIC util DE"](two_pe)) == ("0.80", "0.20")
    one_p_one_d = {"snic": {k: snic[k] for k in ("0", "1")}}  # a run written before roles were recorded
    assert (cells["SNIC util PE"](one_p_one_d), cells["SNIC util DE"](one_p_one_d)) == ("0.90", "0.70")
