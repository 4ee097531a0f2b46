"""Batches of simulations (experiments/batch.py) on a parallel executor give the serial run's
numbers: an in-process stand-in for Ray that runs each batch in reverse order (results land out
of order). At smoke scale nothing runs outside a batch. The adaptive experiment (fig10_11) sends
its bisection steps in lock step over its searches; with synthetic results, each search ends
where the one-search-at-a-time bisection ends."""

import json

from dualpath.experiments.common import Context
from dualpath.experiments.suite import run_suite
from dualpath.pool.executor import SerialExecutor

NAMES = ["fig13_14"]  # 7 runs; fig10_11's lock step is checked with synthetic results below
# wall times and what is computed from them (table3's scheduler cost, the report text)
WALL_KEYS = {"wall_s", "sim_wall_s", "turns_per_wall_s", "policy_wall_s", "scheduler_cores", "cpu_us_per_decision",
             "markdown", "wall_s_total"}


class Reversed:
    parallel = True
    num_workers = 2

    def __init__(self):
        self.batches = []

    def starting(self):
        pass

    def map(self, fn, args, on_done):
        self.batches.append(len(args))
        for i in reversed(range(len(args))):
            on_done(i, fn(*args[i]))


class Counting:
    def __init__(self):
        self.started, self.finished = 0, []

    def start_experiment(self, name): pass
    def end_experiment(self, name, wall_s): pass
    def update_sim(self, task, done, total): pass
    def end_sim(self, task): pass
    def cached(self, label): pass

    def start_sim(self, label, total):
        self.started += 1

    def sim_finished(self, label, wall_s, num_done, num_total):
        self.finished.append((num_done, num_total))


def strip(x):
    if isinstance(x, dict):
        return {k: strip(v) for k, v in x.items() if k not in WALL_KEYS}
    if isinstance(x, list):
        return [strip(v) for v in x]
    return x


def outputs(out):
    return {p.name: strip(json.loads(p.read_text())) for p in sorted(out.glob("*.json"))}


def test_batched_runs_equal_serial_runs_and_nothing_runs_outside_a_batch(tmp_path):
    serial = Counting()
    run_suite(Context(tmp_path / "s", scale="smoke", progress=serial, use_disk_cache=False, executor=SerialExecutor()), NAMES)
    fake, batched = Reversed(), Counting()
    run_suite(Context(tmp_path / "b", scale="smoke", progress=batched, use_disk_cache=False, executor=fake), NAMES)
    assert outputs(tmp_path / "s") == outputs(tmp_path / "b")
    assert batched.started == 0 and not serial.finished  # every batched run came back through the executor
    assert fake.batches == [serial.started]  # one batch
    assert [d for d, _ in batched.finished] == list(range(1, serial.started + 1))


def test_cached_results_are_not_sent_again(tmp_path):
    run_suite(Context(tmp_path, scale="smoke", progress=Counting(), executor=Reversed()), NAMES)
    again = Reversed()
    run_suite(Context(tmp_path, scale="smoke", progress=Counting(), executor=again), NAMES)
    assert again.batches == []  # everything from DIR/cache


def _one_at_a_time(grid, steps, ok):
    """The bisection of fig10_11.capacity before lock step, for one search."""
    grid = sorted(grid)
    first_fail = next((a for a in grid if not ok(a)), None)
    if first_fail is None:
        return grid[-1]
    passing = [a for a in grid if a < first_fail and ok(a)]
    lo, hi = (passing[-1] if passing else 0.0), first_fail
    for _ in range(steps):
        mid = round((lo + hi) / 2, 6)
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def test_lock_step_bisection_ends_where_each_search_alone_ends(tmp_path, monkeypatch):
    from dataclasses import replace

    from dualpath.experiments import fig10_11

    capacity_aps = {"dualpath": 0.5, "basic": 0.3, "oracle": 5.0}  # inside both quick grids; the oracle passes them
    batches = []

    def fake_many(ctx, specs):
        batches.append(len(specs))
        good = {"ttft_window_max_s": 1.0, "ttft_projected_s": 1.0, "tpot_mean_s": 0.01}
        bad = {**good, "ttft_window_max_s": 99.0}
        return [{"probe": {"online": good if s.aps <= capacity_aps[s.mode] else bad}} for s in specs]

    monkeypatch.setattr(fig10_11, "simulate_many", fake_many)
    ctx = Context(tmp_path, scale="quick")
    setups = [replace(s, bisect_steps=k) for s, k in zip(fig10_11.setups(ctx), (3, 1))]
    searches = [(s, m) for s in setups for m in capacity_aps]
    found = fig10_11.capacities(ctx, searches)
    for (setup, mode), (cap, points) in zip(searches, found):
        assert cap["aps"] == _one_at_a_time(setup.grid, setup.bisect_steps, lambda a: a <= capacity_aps[mode]), (setup.label, mode)
        assert len(points) == len(setup.grid) + (0 if mode == "oracle" else setup.bisect_steps)
    # one batch of every grid, then per step the searches still bisecting (not the oracle's)
    assert batches == [sum(len(s.grid) for s, _ in searches), 4, 2, 2]


def test_a_batch_goes_out_longest_first_and_each_result_lands_under_its_own_spec(tmp_path, monkeypatch):
    """prefetch sends the calls of most agents x MaxLen first (a batch on N workers then ends soon
    after its longest call); each result is filed under the spec that made it, whatever the order."""
    from dualpath.experiments import batch as batch_mod
    from dualpath.experiments.simrun import SimSpec

    sent = []

    class Recording(Reversed):
        def map(self, fn, args, on_done):
            sent.extend(a[0] for a in args)
            for i in reversed(range(len(args))):
                on_done(i, {"wall_s": 0.0, "spec": args[i][0].label()})

    monkeypatch.setattr(batch_mod, "run_spec", lambda spec, seed: None)
    specs = [SimSpec("ds-27b", "1P1D", 32768, 64, "basic"), SimSpec("ds-27b", "1P1D", 65536, 128, "basic"),
             SimSpec("ds-27b", "1P1D", 32768, 512, "dualpath"), SimSpec("ds-27b", "1P1D", 65536, 64, "dualpath")]
    ctx = Context(tmp_path, progress=Counting(), executor=Recording())
    assert batch_mod.prefetch(ctx, specs) == 4
    assert [(s.num_agents, s.max_len_tokens) for s in sent] == [(512, 32768), (128, 65536), (64, 65536), (64, 32768)]
    assert [r["spec"] for r in batch_mod.simulate_many(ctx, specs)] == [s.label() for s in specs]  # the caller's order
