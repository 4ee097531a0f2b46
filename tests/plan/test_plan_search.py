"""`dualpath plan` end to end at small scale: ranked by the objective, SLOs first, deterministic,
its first choice's command lines reproduce what it predicted, and bad input is one line, exit 2."""

import json

import pytest

from cli_helpers import cli_here
from dualpath.experiments.common import Context
from dualpath.plan.search import PlanRequest, make_plan, rank
from dualpath.plan.report import to_json
from dualpath.plan.workload import Generated
from dualpath.plan.space import DEFAULT_MODES, configurations, shapes

SMALL = dict(model="ds-27b", gpus=32, workload=Generated(32768, 32, 2))


@pytest.fixture(scope="module")
def small_plan(tmp_path_factory):
    ctx = Context(tmp_path_factory.mktemp("plan"), seed=2, use_disk_cache=False)
    return make_plan(PlanRequest(**SMALL, confirm=4), ctx)


def test_the_plan_simulates_the_best_estimates_then_climbs_until_the_best_has_no_unseen_neighbour(small_plan):
    ranked, rest = small_plan.ranked, small_plan.unconfirmed
    assert len(ranked) >= 4 and len(ranked) + len(rest) + len(small_plan.pruned) == len(configurations(shapes("ds-27b", 32, 32), DEFAULT_MODES))
    jcts = [c.predicted["jct_s"] for c in ranked]
    assert jcts == sorted(jcts) and all(c.meets_slo for c in ranked)  # no SLO: every one meets
    best = ranked[0].estimate
    for e in rest:  # nothing left unsimulated next to the best: same shape, or one PE more or less in its mode
        assert e.shape.pd != best.shape.pd
        assert not (e.mode == best.mode and abs(e.shape.num_prefill_nodes - best.shape.num_prefill_nodes) == 1)
    for c in ranked:
        shape = c.estimate.shape
        assert 32 % shape.copies == 0 and shape.unit_prefill_nodes * shape.copies == shape.num_prefill_nodes
        assert c.predicted["goodput_rps"] == pytest.approx(small_plan.demand.num_turns / c.predicted["jct_s"])


def test_the_plan_is_deterministic_for_a_seed(small_plan, tmp_path):
    again = make_plan(PlanRequest(**SMALL, confirm=4), Context(tmp_path, seed=2, use_disk_cache=False))
    strip = lambda p: {k: v for k, v in to_json(p, 0.0).items()}  # noqa: E731
    assert strip(again) == strip(small_plan)


def test_a_configuration_that_meets_the_slos_ranks_before_a_faster_one_that_misses_them(small_plan):
    import dataclasses
    a, b = small_plan.ranked[:2]
    slow_but_ok = dataclasses.replace(b, meets_slo=True, predicted={**b.predicted, "goodput_rps": 1.0})
    fast_but_missed = dataclasses.replace(a, meets_slo=False, predicted={**a.predicted, "goodput_rps": 0.0})
    for objective in ("jct", "goodput"):
        assert rank([fast_but_missed, slow_but_ok], objective)[0] is slow_but_ok


def test_an_slo_nobody_meets_is_said_and_gives_no_goodput(tmp_path):
    path = tmp_path / "plan.json"
    r = cli_here("plan", "--model", "ds-27b", "--gpus", "16", "--max-len", "32k", "--agents", "8", "--confirm", "1",
                 "--slo-tpot", "0.001", "--json", str(path), "--plot", str(tmp_path / "p.png"))
    assert r.returncode == 0, r.stderr
    report = json.loads(path.read_text())
    assert report["any_meets_slo"] is False and "no simulated configuration meets the SLOs" in r.stdout + r.stderr
    assert report["outranked"] == [] or report["request"]["slo_ttft_p99_s"]  # a TPOT SLO alone bounds nothing
    assert all(v > 1e5 for v in report["machine_heap_ops_per_s"].values())  # the machine's speed beside wall_s
    best = report["ranked"][0]
    assert best["pd"] == "1P1D" and best["predicted"]["goodput_rps"] == 0.0 and best["meets_slo"] is False
    assert set(best["predicted"]) == {"jct_s", "ttft_p50_s", "ttft_p99_s", "tpot_s", "goodput_rps"}
    assert (tmp_path / "p.png").stat().st_size > 0


def test_the_first_choices_unit_command_reproduces_its_prediction(small_plan, tmp_path):
    from dualpath.plan.report import commands

    best = small_plan.ranked[0]
    line = commands(small_plan, best)["unit_sim"].split()
    assert line[:2] == ["dualpath", "sim"]
    r = cli_here(*line[1:], "--quiet", "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    runs = json.loads((tmp_path / "r.json").read_text())["runs"]
    run = runs[0] if isinstance(runs, list) else next(iter(runs.values()))
    assert run["jct_s"] == pytest.approx(best.predicted["jct_s"], rel=1e-9)
    assert run["ttft_s"]["p99"] == pytest.approx(best.predicted["ttft_p99_s"], rel=1e-9)


@pytest.mark.parametrize("args, words", [
    (["--gpus", "12"], "multiple of 8"),
    (["--objective", "fastest"], "--objective must be one of jct, goodput"),
    (["--mode", "oracle"], "oracle is a bound"),
    (["--mode", "sideways"], "sideways"),
    (["--max-len", "lots"], "malformed token count"),
    (["--slo-tpot", "-1"], "--slo-tpot must be positive"),
    (["--confirm", "0"], "--confirm must be at least 1"),
    (["--objective", "goodput", "--slo-tpot", "0.05"], "--objective goodput is for online traffic"),
    (["--objective", "goodput", "--aps", "1"], "--objective goodput needs an SLO"),
    (["--trace", "nowhere.jsonl"], "no such file"),
    (["--aps", "1", "--limit", "3"], "--time-scale and --limit are for --trace"),
    (["--model", "gpt-9"], "gpt-9"),
    (["--local", "gpt-9"], "the local preset knows smollm2-135m and tiny"),
    (["--local", "tiny", "--engines", "1"], "--engines must be 2 to 8"),
    (["--local", "tiny", "--plot", "x.png"], "with --local write --json"),
])
def test_bad_input_is_one_error_line_and_exit_2(args, words):
    r = cli_here("plan", "--model", "ds-27b", "--gpus", "16", "--agents", "4", *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert words in lines[0], lines[0]


def test_a_deployment_of_several_units_runs_its_mode_with_tail_and_its_unit_without(tmp_path):
    from dualpath.experiments.simrun import simulate
    from dualpath.plan.report import commands

    wl = Generated(16384, 16, 1)
    ctx = Context(tmp_path, seed=1)
    plan = make_plan(PlanRequest("ds-27b", 32, wl, modes=("dualpath",), confirm=10), ctx)
    by = {c.estimate.shape.pd: c for c in plan.ranked}
    assert by["2P2D"].estimate.mode == "dualpath+tail" and by["1P3D"].estimate.mode == "dualpath"
    # the unit, one PE group, is where +tail changes nothing: one simulation, the plain mode's
    unit = simulate(ctx, wl.unit_spec("ds-27b", by["2P2D"].estimate.shape, "dualpath"))
    assert by["2P2D"].predicted["jct_s"] == unit["jct_s"]
    assert "--mode dualpath+tail" in commands(plan, by["2P2D"])["sim"]
