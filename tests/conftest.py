"""Suite-wide test settings.

The suite runs the simulator's pure-Python reference (`DUALPATH_BUILD=pure`, set here before
anything imports `dualpath`, inherited by the CLI processes tests start) unless the environment
names a build: `make test-compiled` runs the simulator's tests on the compiled one, and
tests/sim/test_compiled_build.py compares both builds' numbers in every run.

Hypothesis' per-example deadline (200 ms by default) measures wall time, which a loaded 2-core CI
machine can exceed for reasons that are not the code's; property tests here assert values and
invariants, and the suite's own timing checks are explicit. So: no deadline, and no health check
that fails a test because generating its examples was slow."""

import os

os.environ.setdefault("DUALPATH_BUILD", "pure")  # before the imports below: see the docstring

import fcntl  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# The default run is a gate: the same examples every run (derandomized), so a run fails for the code,
# never for the draw. `HYPOTHESIS_PROFILE=explore make test` draws new examples each run, to look
# for what the fixed ones miss (pin what it finds with @example).
settings.register_profile("dualpath", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dualpath"))

# `make test` runs two workers (`-n 2 --dist worksteal`). A test marked `realtime` measures how fast
# the runtime runs (a fidelity error, a JCT ratio, a latency under overload), which the other
# worker's CPU would distort: it takes the run lock exclusively, every other test takes it shared,
# so a realtime test waits for the test in progress on the other worker and then runs alone. Lock
# held from setup to teardown, module fixtures included. Files that take longest go first (seconds
# on the 2-core CI machine, `pytest --durations=40`), the realtime ones before them so that each
# waits for a short test only; the other worker steals the short files from the end of the queue.
_REALTIME_THEN_LONGEST = (
    "tests/e2e/test_fidelity.py",  # realtime, ~65 s
    "tests/e2e/test_cli_runtime.py",  # realtime (the demo's JCT ratio), ~50 s
    "tests/runtime/server/test_overload_server.py",  # realtime, ~25 s
    "tests/sim/test_headline.py",  # two tests, ~65 s each
    "tests/experiments/test_repro.py",  # ~85 s
    "tests/sim/test_compiled_build.py",  # ~75 s
    "tests/deploy/testbed/test_testbed_demo.py",  # ~60 s
    "tests/runtime/model/test_llama_vs_transformers.py",  # ~45 s
    "tests/sim/test_simulator.py",  # ~45 s
    "tests/runtime/cluster/test_ray_restarts.py",  # ~35 s
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(_REALTIME_THEN_LONGEST)}
    root = config.rootpath
    items.sort(key=lambda item: rank.get(item.path.relative_to(root).as_posix(), len(rank)))  # stable: the rest keep their order


_LOCK = []  # the run lock's open file, once this worker has opened it


def _run_lock(config):
    """The lock the workers of one `pytest -n` run share; None in a run without workers (and in a
    pytest that a test starts, which is no worker even though it inherits the worker's environment)."""
    if not hasattr(config, "workerinput"):
        return None
    if not _LOCK:
        _LOCK.append(open(Path(tempfile.gettempdir()) / f"dualpath-tests-{config.workerinput['testrunuid']}.lock", "a"))
    return _LOCK[0]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    lock = _run_lock(item.config)
    if lock is None:
        yield
        return
    fcntl.flock(lock, fcntl.LOCK_EX if item.get_closest_marker("realtime") else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)


def pytest_runtest_setup(item):
    """`pure_only` tests skip where the compiled simulator runs (`make test-compiled`)."""
    if item.get_closest_marker("pure_only") is not None:
        import importlib

        from dualpath._build import build_kind

        importlib.import_module("dualpath.sim.simulator")  # build_kind reads the imported module

        if build_kind() == "compiled":
            pytest.skip("stands in for or instruments the simulator's classes: pure Python only")
