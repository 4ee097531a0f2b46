"""The simulator's speed, the part that does not depend on the machine: simulated turns per million
events (each event one push and one pop of the event heap, sim/events.py), as `dualpath bench
sim-speed` reports it (bench/sim_speed.py). Wall time is not measured here (a loaded CI machine);
the event count is deterministic for a config and seed, so a change that adds events per turn
(a re-armed timer, a pass per byte) fails this floor before it shows as a slower benchmark."""

from __future__ import annotations

from dualpath.bench.sim_speed import run_speed_bench

AGENTS = 8
# `dualpath bench sim-speed --agents 8` (its defaults: ds-v3.2-660b 2P4D 64k dualpath, seed 1) reports
# 1,376 turns in 18,740 events: 73,426 turns per million events (13.6 events a turn). The floor is 95%
# of that: one event more a turn (+7%) fails.
FLOOR_TURNS_PER_MILLION_EVENTS = 0.95 * 73_426


def test_turns_per_million_events_stay_above_the_floor():
    (row,) = run_speed_bench("ds-v3.2-660b", "2P4D", "64k", [AGENTS], "dualpath", 1, None, None)
    assert row["num_turns"] == 1_376  # the workload is the seeded one the floor was measured on
    assert row["turns_per_million_events"] >= FLOOR_TURNS_PER_MILLION_EVENTS, row
    # the machine's own speed, measured around the run, divides the turns per second
    assert 0 < row["heap_ops_per_s_before"] and 0 < row["heap_ops_per_s"]
    assert row["turns_per_million_heap_ops"] == row["turns_per_wall_s"] / row["heap_ops_per_s"] * 1e6


def test_the_machines_heap_speed_is_measured_not_assumed(monkeypatch):
    """heap_ops_per_s times the heap operations it does: a clock that advances 2 s over the loop
    gives 2 x HEAP_OP_PAIRS / 2 s."""
    from dualpath.bench import sim_speed

    ticks = iter([10.0, 12.0])
    monkeypatch.setattr(sim_speed.time, "perf_counter", lambda: next(ticks))
    assert sim_speed.heap_ops_per_s() == 2 * sim_speed.HEAP_OP_PAIRS / 2.0
