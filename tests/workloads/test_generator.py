import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads.generator import CALIBRATED, generate, params_for
from dualpath.workloads.stats import trajectory_stats

# docs/paper.md §4.2, Table 2: MaxLen -> (turns, total, context, per-trajectory append, gen).
TABLE2 = {
    32 * 1024: (60, 28_639, 17_183, 608, 148),
    48 * 1024: (106, 42_607, 25_120, 474, 172),
    64 * 1024: (157, 55_958, 32_721, 429, 176),
}


@pytest.mark.parametrize("max_len", sorted(TABLE2))
@pytest.mark.parametrize("seed", [7, 11])
def test_table2_calibration(max_len, seed):
    s = trajectory_stats(generate(max_len, 500, seed))
    turns, total, context, append, gen = TABLE2[max_len]
    assert s["num_agents"] == 500
    assert s["mean_turns"] == pytest.approx(turns, rel=0.05)
    assert s["mean_total_tokens"] == pytest.approx(total, rel=0.05)
    assert s["mean_context_tokens"] == pytest.approx(context, rel=0.05)
    assert s["mean_output_tokens"] == pytest.approx(gen, rel=0.05)
    # Per-trajectory append is dominated by a few short, tool-output-heavy trajectories, so a
    # 500-set scatters more around the target (a few percent; see the generator docstring).
    assert s["mean_append_tokens"] == pytest.approx(append, rel=0.15)
    # Table 2's per-turn columns are per-trajectory averages; request-weighted ones are smaller.
    assert s["request_mean_append_tokens"] < 0.6 * append


def test_deterministic_per_seed():
    a = generate(64 * 1024, 600, seed=3)
    assert a == generate(64 * 1024, 600, seed=3)
    b = generate(64 * 1024, 600, seed=4)
    assert sum(x.turns != y.turns for x, y in zip(a, b)) > 590


def test_base_set_independent_of_agent_count():
    assert generate(32 * 1024, 120, seed=9) == generate(32 * 1024, 700, seed=9)[:120]


def test_extra_agents_copy_base_with_synthetic_round():
    max_len = 48 * 1024
    trajs = generate(max_len, 1500, seed=5, base_set_size=500)
    base = trajs[:500]
    assert [t.agent for t in trajs] == list(range(1500))
    sources = set()
    for t in trajs[500:]:
        assert t.turns[0] == TurnSpec(64, 1)
        assert t.total_tokens <= max_len
        # The copy is a base trajectory shifted by 65 tokens and cut at MaxLen.
        n = t.num_turns - 1
        matches = [b for b in base if b.turns[:n] == t.turns[1:]]
        assert matches
        src = matches[0]
        sources.add(src.agent)
        assert n == src.num_turns or src.end_tokens(n) + 65 > max_len
    # 1,000 draws from 500 base trajectories cover most of them.
    assert len(sources) > 400


def test_extra_prefix_length_is_configurable():
    trajs = generate(32 * 1024, 510, seed=1, extra_prefix_tokens=128)
    assert all(t.turns[0] == TurnSpec(128, 1) for t in trajs[500:])


@pytest.mark.parametrize("append_scale, gen_scale", [(2.0, 1.0), (1.0, 3.0), (1.5, 1.5)])
def test_scaling_multiplies_rounds_then_truncates(append_scale, gen_scale):
    max_len = 64 * 1024
    plain = generate(max_len, 200, seed=2)
    scaled = generate(max_len, 200, seed=2, append_scale=append_scale, gen_scale=gen_scale)
    for p, s in zip(plain, scaled):
        assert s.total_tokens <= max_len
        expect = tuple(
            TurnSpec(round(x.append_tokens * append_scale), max(1, round(x.gen_tokens * gen_scale)))
            for x in p.turns
        )
        assert s.turns == expect[: s.num_turns]
        assert s.num_turns == len(expect) or s.total_tokens + expect[s.num_turns].append_tokens + expect[
            s.num_turns
        ].gen_tokens > max_len
    mean_plain = sum(t.num_turns for t in plain) / len(plain)
    mean_scaled = sum(t.num_turns for t in scaled) / len(scaled)
    assert mean_scaled < 0.8 * mean_plain


def test_params_interpolate_between_anchors():
    assert params_for(64 * 1024) == CALIBRATED[64 * 1024]
    p, lo, hi = params_for(40 * 1024), CALIBRATED[32 * 1024], CALIBRATED[48 * 1024]
    assert p.append_rate_sigma == pytest.approx((lo.append_rate_sigma + hi.append_rate_sigma) / 2)
    assert p.first_prompt_median_tokens == pytest.approx(
        math.sqrt(lo.first_prompt_median_tokens * hi.first_prompt_median_tokens)
    )
    s = trajectory_stats(generate(40 * 1024, 500, seed=7))
    assert TABLE2[32 * 1024][0] < s["mean_turns"] < TABLE2[48 * 1024][0]
    assert TABLE2[32 * 1024][1] < s["mean_total_tokens"] < TABLE2[48 * 1024][1]


@pytest.mark.parametrize("max_len", [8 * 1024, 128 * 1024])
def test_params_scale_outside_anchors(max_len):
    s = trajectory_stats(generate(max_len, 500, seed=7))
    # Same shape relative to the window as at the nearest anchor (Table 2: ~0.85 of MaxLen).
    assert 0.78 < s["mean_total_tokens"] / max_len < 0.92


@settings(max_examples=15, deadline=None)
@given(
    max_len=st.integers(4 * 1024, 96 * 1024),
    seed=st.integers(0, 2**32 - 1),
    append_scale=st.floats(0.5, 2.0),
    gen_scale=st.floats(0.5, 2.0),
)
def test_no_trajectory_exceeds_max_len(max_len, seed, append_scale, gen_scale):
    trajs = generate(max_len, 40, seed, base_set_size=30, append_scale=append_scale, gen_scale=gen_scale)
    assert len(trajs) == 40
    for t in trajs:
        assert 1 <= t.total_tokens <= max_len
        assert all(x.append_tokens >= 0 and x.gen_tokens >= 1 for x in t.turns)


@pytest.mark.parametrize(
    "kwargs, problem",
    [
        (dict(max_len_tokens=4095), "max_len_tokens must be in"),
        (dict(max_len_tokens=10**9), "max_len_tokens must be in"),
        (dict(max_len_tokens=32768.0), "max_len_tokens must be an integer"),
        (dict(num_agents=0), "num_agents must be an integer >= 1"),
        (dict(seed=-1), "seed must be an integer >= 0"),
        (dict(base_set_size=0), "base_set_size must be an integer >= 1"),
        (dict(append_scale=0.0), "append_scale must be a finite number > 0"),
        (dict(gen_scale=float("nan")), "gen_scale must be a finite number > 0"),
        (dict(extra_prefix_tokens=0), "extra_prefix_tokens must be an integer >= 1"),
    ],
)
def test_invalid_arguments(kwargs, problem):
    args = dict(max_len_tokens=32 * 1024, num_agents=10, seed=0) | kwargs
    with pytest.raises(InputError, match=problem):
        generate(**args)


def test_first_round_too_long_after_scaling():
    with pytest.raises(InputError, match=r"is smaller than the first round .* after append_scale=20.0"):
        generate(4 * 1024, 50, seed=0, append_scale=20.0)
