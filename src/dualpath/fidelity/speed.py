"""The machine's compute speed during runtime runs, measured from the runs' own forwards.

Each engine sums, over its forwards, its model time and the terms of the profile's fit
(protocol.py: Counters.fit_terms). Their ratio to the profile's prediction for the same forwards is
the speed during the runs, per role:

    speed = sum(model seconds) / sum(fixed_s + per_item_s * items + per_ctx_s * ctx + per_key_s * keys)

It reads only forward times, never a request's latency or a run's JCT. `dualpath fidelity` reads it
from calibration runs (calibration.py: the contention its prediction uses) and from the scored runs
(the `replayed` diagnostic only: a prediction never takes it from the runs it is scored on).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

ROLES = ("prefill", "decode")


def predicted_s(fit: Any, forwards: float, terms: Sequence[float]) -> float:
    """The profile's seconds for `forwards` forwards whose fit terms sum to `terms` (items, ctx, keys)."""
    items, ctx, keys = terms
    return fit.fixed_s * forwards + fit.per_item_s * items + fit.per_ctx_s * ctx + fit.per_key_s * keys


def in_run_speed(profile: Any, runs: Sequence[dict]) -> dict[str, float]:
    """Per role, the runs' model time over the profile's prediction for the same forwards (1.0 for a
    role that ran no forward, or runs without `model_time`)."""
    out: dict[str, float] = {}
    for role, fit in zip(ROLES, (profile.prefill_fit, profile.decode_fit)):
        times = [r["model_time"][role] for r in runs if "model_time" in r]
        busy = sum(t["busy_s"] for t in times)
        pred = sum(predicted_s(fit, t["forwards"], t["fit_terms"]) for t in times)
        out[role] = busy / pred if pred > 0 and busy > 0 else 1.0
    return out


def at_speed(profile: Any, speed: dict[str, float]) -> Any:
    """The profile with its prefill and decode fits scaled by `speed` (steps that many times as long)."""
    return replace(profile, prefill_fit=profile.prefill_fit.scaled(speed["prefill"]),
                   decode_fit=profile.decode_fit.scaled(speed["decode"]))
