"""Split reads (core/policy/split.py): the rule's arithmetic and its properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpath.core.policy.split import MIN_SPLIT_BLOCKS, SplitRule, finish_times_s, split_read
from dualpath.core.snapshot import ReadSide

GB = 1e9
# DS 27B-like: 64-token blocks; the PE node's SNIC at half the DE node's; the DE's 8 CNICs of 50 GB/s
RULE = SplitRule(block_tokens=64, kv_bytes_per_token=40_000, pe_read_bytes_per_s=25 * GB,
                 de_read_bytes_per_s=50 * GB, de_stream_bytes_per_s=400 * GB)

rules = st.builds(
    SplitRule,
    block_tokens=st.sampled_from([16, 64]),
    kv_bytes_per_token=st.integers(1_000, 300_000),
    pe_read_bytes_per_s=st.floats(1 * GB, 100 * GB),
    de_read_bytes_per_s=st.floats(1 * GB, 100 * GB),
    de_stream_bytes_per_s=st.floats(10 * GB, 800 * GB),
    min_blocks=st.integers(2, 16),
)
queues = st.integers(0, 2_000_000)
hits = st.integers(0, 200_000)
sides = st.sampled_from(list(ReadSide))


def test_an_idle_pair_splits_by_rate():
    hit = 64 * 300
    pe = split_read(RULE, hit, 0, 0, ReadSide.PREFILL)
    # seconds per token: PE 1.6 us, DE 0.8 + 0.1 = 0.9 us; PE's share 0.9 / 2.5 = 36%
    assert pe % 64 == 0 and pe / hit == pytest.approx(0.36, abs=64 / hit)
    t_pe, t_de = finish_times_s(RULE, pe, hit - pe, 0, 0)
    assert abs(t_pe - t_de) <= 64 * RULE.pe_s_per_token


def test_a_long_queue_on_one_side_sends_the_whole_hit_to_the_other():
    hit = 64 * 100
    assert split_read(RULE, hit, 10_000_000, 0, ReadSide.DECODE) == 0
    assert split_read(RULE, hit, 0, 10_000_000, ReadSide.DECODE) == hit


def test_a_small_hit_goes_to_the_chosen_side():
    small = 64 * (MIN_SPLIT_BLOCKS - 1)
    assert split_read(RULE, small, 0, 0, ReadSide.PREFILL) == small
    assert split_read(RULE, small, 0, 0, ReadSide.DECODE) == 0
    assert split_read(RULE, 0, 0, 0, ReadSide.PREFILL) == 0
    with pytest.raises(ValueError):
        split_read(RULE, -1, 0, 0, ReadSide.PREFILL)
    with pytest.raises(ValueError):
        SplitRule(64, 1000, 0.0, 1.0, 1.0)


@settings(max_examples=300, deadline=None)
@given(rule=rules, hit=hits, q_pe=queues, q_de=queues, side=sides)
def test_conservation_blocks_and_threshold(rule, hit, q_pe, q_de, side):
    pe = split_read(rule, hit, q_pe, q_de, side)
    de = hit - pe
    assert 0 <= pe <= hit and pe + de == hit
    assert pe % rule.block_tokens == 0 or pe == hit  # the PE side reads a prefix of whole blocks
    if -(-hit // rule.block_tokens) < rule.min_blocks:  # never split below the threshold
        assert pe == (hit if side is ReadSide.PREFILL else 0)


@settings(max_examples=300, deadline=None)
@given(rule=rules, hit=hits, q_pe=queues, q_de=queues)
def test_a_split_finishes_both_sides_within_one_block_time(rule, hit, q_pe, q_de):
    pe = split_read(rule, hit, q_pe, q_de, ReadSide.PREFILL)
    if 0 < pe < hit:
        t_pe, t_de = finish_times_s(rule, pe, hit - pe, q_pe, q_de)
        block_s = rule.block_tokens * max(rule.pe_s_per_token, rule.de_s_per_token)
        assert abs(t_pe - t_de) <= block_s * (1 + 1e-9)
        # and no other cut of whole blocks finishes earlier
        best = min(max(finish_times_s(rule, min(hit, k * rule.block_tokens), hit - min(hit, k * rule.block_tokens),
                                      q_pe, q_de)) for k in range(-(-hit // rule.block_tokens) + 1))
        assert max(t_pe, t_de) <= best * (1 + 1e-9)


@settings(max_examples=300, deadline=None)
@given(rule=rules, hit=hits, q_pe=queues, q_de=queues, more=st.integers(1, 500_000), side=sides)
def test_more_queue_on_a_side_never_gives_it_more_blocks(rule, hit, q_pe, q_de, more, side):
    pe = split_read(rule, hit, q_pe, q_de, side)
    assert split_read(rule, hit, q_pe + more, q_de, side) <= pe  # PE side longer: no more PE blocks
    assert hit - split_read(rule, hit, q_pe, q_de + more, side) <= hit - pe  # DE side longer: no more DE blocks
