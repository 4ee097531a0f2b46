"""Rates from a profile: a hand-computed case, the turns of the demo's block-aligned workload, and
the CPU plan."""

from dataclasses import replace

import pytest

from dualpath.runtime.profile.calibrate import (DECODE_GRID, ComputeProfile, ProfileKey, StepFit, StepTime, fit_decode_steps,
                                            fit_steps, prefill_keys)
from dualpath.runtime.engine.cpus import plan_cpus
from dualpath.runtime.profile.emulation import TurnCost, derive_rates, given_rates, predicted_basic_jct_s, trajectory_turns


def profile(fixed_s=0.1, per_token_s=0.01, per_key_s=0.0) -> ComputeProfile:
    key = ProfileKey("test cpu x2", "fp", "cpu", 1)
    step = (StepTime(1, 0, 1.0),)
    return ComputeProfile(key, step, step, StepFit(fixed_s, per_token_s, per_key_s), StepFit(0.0, 0.01, 0.0), "now", 0.0)


def test_turns_of_a_block_aligned_trajectory_hit_every_computed_block():
    # 190 + 3 generated: the KV of 192 tokens is computed (the last token is never fed back)
    turns = trajectory_turns([(190, 3), (61, 3), (61, 3)], 64)
    assert turns == [TurnCost(0, 190), TurnCost(192, 62), TurnCost(256, 62)]


def test_derived_snic_rate_makes_loading_take_the_stated_multiple_of_compute():
    p = profile(fixed_s=0.1, per_token_s=0.01)  # a 62-token prefill: 0.1 + 0.62 = 0.72 s
    turns = [TurnCost(0, 190), TurnCost(192, 62), TurnCost(256, 62)]
    kv = 1000  # bytes per token
    r = derive_rates(p, turns, kv, load_over_compute=4.0)
    # hits: 448 tokens = 448,000 B; compute of the warm turns: 2 x 0.72 = 1.44 s; rate = 448,000 / (4 x 1.44)
    assert r.snic_bytes_per_s == pytest.approx(448_000 / 5.76)
    assert r.cnic_bytes_per_s == pytest.approx(8 * r.snic_bytes_per_s)
    assert r.source == "derived" and r.load_over_compute == 4.0
    # basic: the cold prefill (0.1 + 1.9 = 2.0 s) then every hit through one SNIC (4 x 1.44 = 5.76 s)
    assert r.predicted_basic_jct_s == pytest.approx(2.0 + 5.76)
    assert predicted_basic_jct_s(p, turns, kv, r.snic_bytes_per_s) == pytest.approx(7.76)


def test_given_rate_reports_the_regime_it_implies():
    p = profile(fixed_s=0.1, per_token_s=0.01)
    turns = [TurnCost(0, 190), TurnCost(192, 62), TurnCost(256, 62)]
    r = given_rates(p, turns, 1000, snic_bytes_per_s=448_000 / 2.88)  # loads take 2.88 s = 2x compute
    assert r.source == "given" and r.load_over_compute == pytest.approx(2.0)


def test_a_workload_without_hits_cannot_derive_a_rate():
    with pytest.raises(ValueError, match="no turn"):
        derive_rates(profile(), [TurnCost(0, 100)], 1000)


def test_fit_recovers_a_linear_and_attention_cost():
    truth = lambda n, c: 0.05 + 0.002 * n + 1e-7 * prefill_keys(n, c)
    pts = [StepTime(n, c, truth(n, c)) for n, c in ((32, 0), (192, 0), (64, 512), (32, 1536), (128, 1536))]
    fit = fit_steps(pts, prefill_keys)
    assert (fit.fixed_s, fit.per_item_s, fit.per_key_s) == pytest.approx((0.05, 0.002, 1e-7), rel=1e-6)


def test_decode_fit_is_bilinear_in_batch_and_longest_context():
    """The SmolLM2 grid measured on the development machine (`dualpath calibrate`) costs 6.5 us per context token
    at batch 1 and 14 us per sequence-token at batch 8: a fit without the context-alone term misses
    batch 1. On the grid the bilinear fit recovers all four terms, and the profile predicts with it."""
    truth = lambda b, c: 0.047 + 0.004 * b + 5e-6 * c + 1.1e-5 * b * c
    pts = [StepTime(b, c, truth(b, c)) for b, c in DECODE_GRID]
    fit = fit_decode_steps(pts)
    assert (fit.fixed_s, fit.per_item_s, fit.per_ctx_s, fit.per_key_s) == pytest.approx((0.047, 0.004, 5e-6, 1.1e-5), rel=1e-6)
    prof = replace(profile(), decode=tuple(pts), decode_fit=fit)
    assert prof.decode_step_s(3, 700) == pytest.approx(truth(3, 700), rel=1e-6)
    assert prof.scaled(2.0).decode_step_s(3, 700) == pytest.approx(2 * truth(3, 700), rel=1e-6)


def test_fit_drops_a_term_that_noise_makes_negative():
    pts = [StepTime(32, 0, 0.10), StepTime(64, 0, 0.20), StepTime(32, 2048, 0.099), StepTime(64, 2048, 0.199)]
    fit = fit_steps(pts, prefill_keys)
    assert min(fit.fixed_s, fit.per_item_s, fit.per_key_s) >= 0.0


def test_cpu_plan_gives_each_engine_its_own_cpus_and_keeps_one_for_the_router():
    plan = plan_cpus([0, 1], range(16))
    assert plan.cpus_by_engine == {0: tuple(range(1, 8)), 1: tuple(range(8, 15))}
    assert plan.threads_by_engine == {0: 7, 1: 7} and plan.router_cpus == (0,) and plan.pinned
    two = plan_cpus([0, 1], [0, 1])  # this kind of machine: one core per engine, the router shares
    assert two.cpus_by_engine == {0: (0,), 1: (1,)} and two.threads_by_engine == {0: 1, 1: 1}
    assert "share" in two.note
    assert plan_cpus([0, 1], [0, 1], threads=2).threads_by_engine == {0: 2, 1: 2}


def test_cpu_plan_with_fewer_cpus_than_engines_pins_nothing_and_says_so():
    plan = plan_cpus([0, 1, 2], [0, 1])
    assert not plan.pinned and plan.threads_by_engine == {0: 1, 1: 1, 2: 1}
    assert "2 CPU(s) for 3 engines" in plan.note and "slow each other" in plan.note
