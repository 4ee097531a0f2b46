"""`--workers N` without `--ray` (pool/executor.py: ProcessExecutor): the calls run in processes of
this host, every result reaches `on_done` once with its index, an error stops the batch, and the
planner's ranking is the serial one."""

from __future__ import annotations

import math
import operator

import pytest

from dualpath.errors import InputError
from dualpath.pool.executor import ProcessExecutor, SerialExecutor, open_executor


def _run(executor, fn, args):
    got = {}
    executor.map(fn, args, lambda i, r: got.setdefault(i, r))
    return [got[i] for i in range(len(args))]


def test_processes_give_the_serial_results_by_index():
    args = [(i, 7) for i in range(6)]
    with open_executor(None, 2) as ex:
        assert isinstance(ex, ProcessExecutor) and ex.parallel
        assert _run(ex, operator.mul, args) == _run(SerialExecutor(), operator.mul, args) == [7 * i for i in range(6)]
        with pytest.raises(ValueError):
            _run(ex, math.sqrt, [(4.0,), (-1.0,)])
    assert ex._pool is None  # shut down with the block


def test_one_worker_is_this_process_and_zero_is_refused():
    with open_executor(None, 1) as ex:
        assert isinstance(ex, SerialExecutor)
    with pytest.raises(InputError, match="--workers must be at least 1"):
        with open_executor(None, 0):
            pass


def test_the_plan_ranks_alike_in_processes(tmp_path):
    from dualpath.experiments.common import Context
    from dualpath.plan.search import PlanRequest, make_plan
    from dualpath.plan.workload import Generated

    req = PlanRequest("ds-27b", 32, Generated(16384, 16, 1), confirm=3)
    serial = make_plan(req, Context(tmp_path, seed=1))
    with open_executor(None, 2) as ex:
        apart = make_plan(req, Context(tmp_path, seed=1, executor=ex))
    assert [(c.estimate.shape.pd, c.estimate.mode, c.predicted) for c in serial.ranked] == \
        [(c.estimate.shape.pd, c.estimate.mode, c.predicted) for c in apart.ranked]


def test_announce_runs_once_when_work_first_begins_and_not_before():
    """`open_executor(..., announce=)`: the CLI's build line comes with the first batch or the first
    simulation a caller runs itself, once; a command that fails before any work prints nothing."""
    said = []
    with open_executor(None, None, announce=lambda: said.append("build")) as ex:
        assert said == [] and not ex.parallel and ex.num_workers == 1
        assert _run(ex, operator.mul, [(2, 3)]) == [6]
        assert said == ["build"]
        ex.starting()
        assert _run(ex, operator.mul, [(4, 5)]) == [20]
    assert said == ["build"]
    with open_executor(None, None, announce=lambda: said.append("again")) as ex:
        ex.starting()
        ex.starting()
    assert said == ["build", "again"]
    with pytest.raises(InputError, match="--workers"), open_executor(None, 0, announce=lambda: said.append("no")):
        pass
    assert said == ["build", "again"]
