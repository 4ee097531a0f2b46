"""`bench salts`'s judgements on made-up TTFTs: another salt within the cold spread, the hit below it."""

from __future__ import annotations

from dualpath.bench.salts import summarise


def _rows(cold: list[float], other: list[float], hit: list[float], other_cached: int = 0) -> list[dict]:
    return [{"cold": {"ttft_s": c, "cached": 0}, "other_salt": {"ttft_s": o, "cached": other_cached},
             "hit": {"ttft_s": h, "cached": 960}} for c, o, h in zip(cold, other, hit)]


def test_another_salt_like_cold_and_a_hit_faster():
    cold = [1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 0.85, 1.0, 1.1, 0.9]
    s = summarise(_rows(cold, [c * 1.02 for c in cold], [0.2] * 10))
    assert s["other_salt_within_cold_spread"] and s["hit_below_cold_spread"] and s["never_cached_across_salts"]
    assert abs(s["other_salt_over_cold"] - 1.02) < 0.01 and s["hit"]["cached_tokens"] == [960]


def test_a_leak_shows_in_time_and_in_cached_tokens():
    cold = [1.0, 1.1, 0.9, 1.05, 0.95, 1.2, 0.85, 1.0, 1.1, 0.9]
    s = summarise(_rows(cold, [0.2] * 10, [0.2] * 10, other_cached=960))
    assert not s["other_salt_within_cold_spread"] and not s["never_cached_across_salts"]
