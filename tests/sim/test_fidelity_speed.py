"""fidelity/speed.py: the SpeedModel fitted from runtime forwards recovers the model that made them;
the local preset runs the profile at it (core/measured.py: StepGrid); fidelity/calibration.py reads
a run's forwards and its decode engine's KV traffic from its timeline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dualpath.core.measured import StepGrid
from dualpath.fidelity.speed import Drift, SpeedModel, curve_s, decode_grid, fit_speed
from dualpath.runtime.profile.calibrate import StepFit, StepTime

DECODE = [StepTime(b, c, 0.05 + 0.01 * b + 2e-5 * c + 4e-6 * b * c + (0.01 if (b, c) == (4, 1024) else 0.0))
          for b in (1, 4, 8) for c in (256, 1024, 2048)]
PROFILE = SimpleNamespace(prefill_fit=StepFit(0.02, 1e-3, 1e-8), decode_fit=StepFit(0.05, 0.01, 4e-6, 2e-5), decode=DECODE)
TRUE = SpeedModel(prefill_scale=1.1, prefill_overhead_s=0.25, decode_scale=1.05, decode_io_slowdown=0.4,
                  decode_join_s=0.03)


def _steps(drift: float | Drift, model: SpeedModel = TRUE) -> dict:
    """A run's step records (fidelity/calibration.py: step_records) made by `model` at `drift`:
    prefill forwards of 40-600 tokens; decode steps with none, half or all of their time under
    their engine's KV traffic, some with a request joining."""
    grid, d = decode_grid(PROFILE), Drift.of(drift)
    prefill, decode, t = [], [], 0.0
    for i, tokens in enumerate((40, 600, 80, 300, 50, 450)):
        keys = tokens * (tokens + 1) / 2 + 200 * tokens
        s = model.prefill_scale * d.prefill * curve_s(PROFILE, grid, "prefill", tokens, keys) + model.prefill_overhead_s
        prefill.append([tokens, keys, s, t, t + s])
        for j, (batch, ctx) in enumerate(((1, 300), (3, 900), (6, 1500), (2, 1900))):
            io = (0.0, 1.0, 0.5, 0.0)[(i + j) % 4]
            joins = 1 if (i + j) % 3 == 0 else 0
            step = (model.decode_scale * d.decode * curve_s(PROFILE, grid, "decode", batch, ctx)
                    * (1 + model.decode_io_slowdown * io) + model.decode_join_s * d.decode * joins)
            start = t + s + j
            decode.append([batch, ctx, step, start, start + step, joins, io])
        t += s + 100.0
    return {"prefill": prefill, "decode": decode}


def test_the_fit_recovers_the_speed_that_made_the_forwards():
    got = fit_speed(PROFILE, [(_steps(1.0), 1.0), (_steps(1.2), 1.2)])
    for name in ("prefill_scale", "prefill_overhead_s", "decode_scale", "decode_io_slowdown", "decode_join_s"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name


def test_terms_the_runs_do_not_show_are_left_out_not_made_negative():
    plain = SpeedModel(prefill_scale=1.3, decode_scale=1.2)
    got = fit_speed(PROFILE, [(_steps(1.0, plain), 1.0)])
    assert got.prefill_scale == pytest.approx(1.3) and got.prefill_overhead_s == pytest.approx(0.0, abs=1e-9)
    assert got.decode_scale == pytest.approx(1.2) and got.decode_io_slowdown == pytest.approx(0.0, abs=1e-9)
    assert got.decode_join_s == pytest.approx(0.0, abs=1e-9)
    assert fit_speed(PROFILE, []) == SpeedModel()  # nothing measured: the profile as it is


def test_a_model_moves_to_another_drift_with_its_seconds():
    d = TRUE.drifted(1.5, fitted_at_drift=1.2)
    assert d.prefill_scale == pytest.approx(1.65) and d.decode_scale == pytest.approx(1.575)
    assert d.prefill_overhead_s == pytest.approx(0.25 * 1.25) and d.decode_join_s == pytest.approx(0.03 * 1.25)
    assert d.decode_io_slowdown == TRUE.decode_io_slowdown


def test_decode_steps_interpolate_the_measured_grid_exactly_at_its_points():
    grid = decode_grid(PROFILE)
    for p in DECODE:
        assert grid.step_s(p.tokens, p.context_tokens) == pytest.approx(p.seconds)
    mid = grid.step_s(2.5, 640)  # halfway in batch (1..4) and in context (256..1024)
    corners = [grid.step_s(b, c) for b in (1, 4) for c in (256, 1024)]
    assert mid == pytest.approx(sum(corners) / 4)
    assert grid.step_s(16, 2048) > grid.step_s(8, 2048)  # beyond the grid: the last segment, extrapolated
    with pytest.raises(ValueError, match="grid"):
        StepGrid.of([(1, 256, 0.1), (4, 256, 0.2), (1, 1024, 0.3)])
    assert decode_grid(SimpleNamespace(prefill_fit=None, decode_fit=None)) is None  # no points: the fit


def test_the_local_preset_runs_the_profile_at_the_speed():
    from dualpath.config import LinkConfig, RuntimeConfig
    from dualpath.costmodel.models import TINY
    from dualpath.fidelity.preset import local_sim_config

    rt = RuntimeConfig(model="tiny", links=LinkConfig(snic_bytes_per_s=1e6))
    m = local_sim_config(rt, PROFILE, TINY.kv_bytes_per_token, "test", TRUE).local
    assert m.prefill_fixed_s == pytest.approx(1.1 * 0.02) and m.prefill_overhead_s == 0.25
    assert m.decode_step_s(4, 1024) == pytest.approx(1.05 * DECODE[4].seconds)  # the grid point, not the fit
    assert m.decode_io_slowdown == 0.4 and m.decode_join_s == 0.03


def test_step_records_read_forwards_joins_and_the_decode_engines_own_traffic():
    from dualpath.fidelity.calibration import step_records
    from dualpath.metrics.timeline import Timeline

    tl = Timeline()  # a 1P1D cluster: PE0 is node 0, DE0 node 1
    tl.span("PE0", "prefill", 0.0, 1.0, None, {"tokens": 100, "keys": 5050.0, "model_s": 0.9, "requests": ["a0t0"]})
    tl.span("SNIC node0 read", "read", 0.0, 4.0, "a1t1")  # the PE's reads: not the DE's copies
    tl.span("CNIC PE0", "transfer", 2.0, 6.0, "a0t0")  # the PE's copy into the DE's buffer: the PE's work
    tl.span("CNIC DE0", "h2d", 2.0, 2.5, "a0t0")
    tl.span("CNIC DE0 (2)", "d2h", 2.5, 2.75, "a0t0")  # a lane of the DE's CNIC track
    tl.span("SNIC node1 write", "persist", 2.0, 5.0, None)  # the write bucket's wait: not a copy
    tl.span("SNIC node1 read", "read", 3.0, 5.0, "a1t1")
    tl.span("CNIC DE0", "transfer", 4.5, 4.75, "a1t1")
    for t0, reqs in ((2.0, ["a0t0"]), (3.0, ["a0t0", "a1t0"]), (4.0, ["a1t0"])):
        tl.span("DE0", "decode", t0, t0 + 1.0, None, {"batch": len(reqs), "ctx": 200, "model_s": 0.8, "requests": reqs})
    got = step_records(tl.to_chrome("runtime"))
    assert got["prefill"] == [[100, 5050.0, 0.9, 0.0, 1.0]]
    # [2, 3): the H2D then the D2H; [3, 4): no copy of its own; [4, 5): a layer stream for a quarter
    assert [row[5:] for row in got["decode"]] == [[1, 0.75], [1, 0.0], [0, 0.25]]


def test_the_calibration_fits_one_speed_over_every_modes_runs():
    """fidelity/calibration.py: the engines compute alike whichever mode schedules them, so the
    calibration fits one SpeedModel over all its runs, each at its drift. A basic run whose decode
    steps never overlap KV traffic cannot show the slowdown while moving KV; together with a
    dualpath run that does, the one fit recovers every term of the speed that made both."""
    from dualpath.fidelity.calibration import CalibrationRuns

    basic = _steps(1.1)
    for row in basic["decode"]:  # no KV traffic during its steps: io 0, the time without the slowdown
        row[2] = (row[2] - TRUE.decode_join_s * 1.1 * row[5]) / (1 + TRUE.decode_io_slowdown * row[6]) \
            + TRUE.decode_join_s * 1.1 * row[5]
        row[6] = 0.0
    calib = CalibrationRuns()
    calib.add("demo", [{"mode": "basic", "jct_s": 1.0, "steps": basic}], [1.1])
    calib.add("demo", [{"mode": "dualpath", "jct_s": 1.0, "steps": _steps(0.9)}], [0.9])
    got = calib.speed(PROFILE)
    for name in ("prefill_scale", "prefill_overhead_s", "decode_scale", "decode_io_slowdown", "decode_join_s"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    alone = fit_speed(PROFILE, [(basic, 1.1)])  # basic's runs alone see no slowdown to fit
    assert alone.decode_io_slowdown == 0.0 and alone.decode_scale == pytest.approx(TRUE.decode_scale, rel=1e-6)
    assert calib.to_json(PROFILE)["speed"] == got.to_json()


def test_every_calibration_run_needs_its_drift():
    from dualpath.fidelity.calibration import CalibrationRuns

    with pytest.raises(ValueError):  # a drift for every run
        CalibrationRuns().add("demo", [{"mode": "basic"}, {"mode": "dualpath"}], [1.0])


def test_one_outlying_check_moves_no_run():
    """calibration.py: `smoothed`, a running median of three over the session's checks, per role:
    a check far from both neighbours takes their level; a level two checks in a row agree on
    stays; the ends take the median of the three at their end."""
    from dualpath.fidelity.calibration import smoothed

    prefill = [0.86, 0.86, 0.86, 1.32, 1.02, 0.90]
    decode = [0.88, 0.88, 0.89, 0.99, 0.92, 0.91]
    got = smoothed([Drift(p, d) for p, d in zip(prefill, decode)])
    assert [d.prefill for d in got] == [0.86, 0.86, 0.86, 1.02, 1.02, 1.02]
    assert [d.decode for d in got] == [0.88, 0.88, 0.89, 0.92, 0.92, 0.92]
    assert smoothed([1.3, 0.9, 0.9, 0.9])[0] == Drift(0.9, 0.9)  # an outlying first check too
    step = [1.0, 1.0, 1.0, 1.5, 1.5, 1.5]  # the machine changed speed: the new level is kept
    assert [d.prefill for d in smoothed(step)] == step
    assert smoothed([1.2, 0.8]) == [Drift(1.2, 1.2), Drift(0.8, 0.8)]  # too few to tell an outlier


def test_each_role_runs_at_its_own_drift():
    """speed.py: a Drift moves prefill and decode apart; a fit at per-role drifts recovers the
    speed that made the steps, and `drifted` moves each role's terms by its own drift only."""
    drift = Drift(prefill=1.3, decode=0.8)
    got = fit_speed(PROFILE, [(_steps(drift), drift)])
    for name in ("prefill_scale", "prefill_overhead_s", "decode_scale", "decode_io_slowdown", "decode_join_s"):
        assert getattr(got, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    moved = TRUE.drifted(Drift(2.0, 1.0), Drift(1.0, 1.0))
    assert moved.prefill_scale == 2 * TRUE.prefill_scale and moved.prefill_overhead_s == 2 * TRUE.prefill_overhead_s
    assert (moved.decode_scale, moved.decode_join_s) == (TRUE.decode_scale, TRUE.decode_join_s)
    assert Drift.of({"prefill": 1.1, "decode": 0.9}) == Drift(1.1, 0.9) and Drift.of(1.2) == Drift(1.2, 1.2)
