"""Simulations as Ray tasks (deploy/ray/pool.py) on a local Ray of 2 CPUs, one session for the
module (start-up ~5 s): the same numbers as the serial run, apart from wall times, for a repro
experiment and a sweep; a progress line per finished simulation; a wrong code identity refused."""

import json

import pytest

ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra: pip install 'dualpath[cluster]'")

from dualpath.errors import InputError  # noqa: E402
from dualpath.experiments.common import Context  # noqa: E402
from dualpath.experiments import fig13_14  # noqa: E402
from dualpath.experiments.simrun import _cache_key, code_fingerprint  # noqa: E402
from dualpath.experiments.suite import run_suite  # noqa: E402
from dualpath.pool.executor import SerialExecutor  # noqa: E402
from dualpath.deploy.ray.pool import LOCAL_OBJECT_STORE_BYTES, RayExecutor  # noqa: E402
from dualpath.sweep.run import run_sweep  # noqa: E402
from dualpath.sweep.spec import parse_spec  # noqa: E402

from test_batches import Counting, outputs  # noqa: E402


@pytest.fixture(scope="module")
def executor():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=LOCAL_OBJECT_STORE_BYTES,
             logging_level="ERROR")
    try:
        yield RayExecutor(ray, code_fingerprint)
    finally:
        ray.shutdown()


def test_repro_experiment_on_ray_equals_serial(tmp_path, executor):
    run_suite(Context(tmp_path / "s", scale="smoke", use_disk_cache=False, executor=SerialExecutor()), ["fig13_14"])
    lines = Counting()
    run_suite(Context(tmp_path / "r", scale="smoke", progress=lines, executor=executor), ["fig13_14"])
    assert outputs(tmp_path / "s") == outputs(tmp_path / "r")
    ctx = Context(tmp_path / "r", scale="smoke", seed=1)
    keys = {_cache_key(s, 1) for s in fig13_14.planned(ctx)}
    assert lines.started == 0 and [d for d, _ in lines.finished] == list(range(1, len(keys) + 1))  # a line per run
    assert {p.stem for p in (tmp_path / "r" / "cache").glob("*.json")} == keys  # keyed as the serial run keys them


def test_sweep_on_ray_equals_serial(tmp_path, executor):
    spec = parse_spec({"model": "ds-27b", "pd": ["1P1D", "1P2D"], "max_len": "32k", "agents": 16,
                       "mode": ["basic", "dualpath"], "seed": [1, 2]})
    serial = run_sweep(spec, tmp_path / "s", SerialExecutor(), Counting())
    on_ray = run_sweep(spec, tmp_path / "r", executor, Counting())
    no_wall = [[{k: v for k, v in r.items() if k != "wall_s"} for r in rows] for rows in (serial, on_ray)]
    assert no_wall[0] == no_wall[1] and len(serial) == 8
    assert len({json.dumps(r, sort_keys=True) for r in no_wall[0]}) == 8  # the points differ from each other


def test_a_worker_with_other_code_is_refused(executor):
    import os

    seen = []
    with pytest.raises(InputError, match="other code"):  # os.getpid: every worker answers other than this process
        RayExecutor(ray, os.getpid).map(abs, [(-1,), (-2,)], lambda i, r: seen.append(r))
    assert seen == []  # no result from a mismatched worker is used


def test_plan_on_ray_equals_serial(tmp_path, executor):
    """`dualpath plan --ray`: the same ranking and numbers, generated (unit simulations through the
    cache keys) and a trace searched for goodput (whole simulations through `run_mode`)."""
    from dualpath.bench.plan_check import TRACE_SLICE
    from dualpath.plan.report import to_json
    from dualpath.plan.search import PlanRequest, make_plan
    from dualpath.plan.workload import Generated, Trace

    for req in (PlanRequest("ds-27b", 32, Generated(32768, 16, 1), confirm=2),
                PlanRequest("ds-27b", 32, Trace(str(TRACE_SLICE), 32768, limit=300), confirm=2, objective="goodput",
                            slo_ttft_p99_s=2.0)):
        serial = to_json(make_plan(req, Context(tmp_path / "s", use_disk_cache=False)), 0.0)
        on_ray = to_json(make_plan(req, Context(tmp_path / "r", use_disk_cache=False, executor=executor)), 0.0)
        assert serial == on_ray and len(serial["ranked"]) >= 2
