"""fidelity/speed.py: the runs' compute speed from their forwards, and the profile scaled by it."""

from __future__ import annotations

import pytest

from dualpath.fidelity.speed import at_speed, in_run_speed, predicted_s
from dualpath.runtime.apps.calibrate import ComputeProfile, ProfileKey, StepFit

PROFILE = ComputeProfile(ProfileKey("m", "x", "cpu", 1), (), (), StepFit(0.01, 1e-4, 1e-8),
                         StepFit(0.02, 1e-3, 1e-7, 1e-6), "now", 1.0)


def _run(pf_factor: float, df_factor: float, pf_terms=(500.0, 0.0, 4e5), df_terms=(40.0, 8000.0, 3e4)) -> dict:
    """A run whose forwards took `factor` times the profile's prediction."""
    return {"model_time": {
        "prefill": {"busy_s": pf_factor * predicted_s(PROFILE.prefill_fit, 5, pf_terms), "forwards": 5, "fit_terms": list(pf_terms)},
        "decode": {"busy_s": df_factor * predicted_s(PROFILE.decode_fit, 10, df_terms), "forwards": 10, "fit_terms": list(df_terms)}}}


def test_predicted_seconds_are_the_fit_over_the_summed_terms():
    f = PROFILE.decode_fit
    assert predicted_s(f, 10, (40, 8000, 3e4)) == pytest.approx(10 * 0.02 + 40 * 1e-3 + 8000 * 1e-6 + 3e4 * 1e-7)


def test_speed_is_summed_model_time_over_summed_prediction_per_role():
    assert in_run_speed(PROFILE, [_run(1.25, 0.8)]) == pytest.approx({"prefill": 1.25, "decode": 0.8})
    a, b = _run(1.0, 1.0), _run(2.0, 3.0, df_terms=(80.0, 16000.0, 6e4))
    pred_a = predicted_s(PROFILE.decode_fit, 10, (40.0, 8000.0, 3e4))
    pred_b = predicted_s(PROFILE.decode_fit, 10, (80.0, 16000.0, 6e4))
    want = (pred_a + 3.0 * pred_b) / (pred_a + pred_b)  # weighted by the prediction, not a mean of ratios
    assert in_run_speed(PROFILE, [a, b])["decode"] == pytest.approx(want)
    assert in_run_speed(PROFILE, [{}]) == {"prefill": 1.0, "decode": 1.0}  # nothing measured: unscaled


def test_the_profile_at_a_speed_scales_each_role_alone():
    p = at_speed(PROFILE, {"prefill": 2.0, "decode": 0.5})
    terms = (128.0, 0.0, 128 * 512 + 128 * 129 / 2)
    assert predicted_s(p.prefill_fit, 1, terms) == pytest.approx(2.0 * predicted_s(PROFILE.prefill_fit, 1, terms))
    assert p.decode_step_s(4, 1024) == pytest.approx(0.5 * PROFILE.decode_step_s(4, 1024))
    assert p.prefill == PROFILE.prefill and p.key == PROFILE.key
