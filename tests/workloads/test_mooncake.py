import hashlib
import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualpath.errors import InputError
from dualpath.workloads import MOONCAKE_SLICE
from dualpath.workloads.mooncake import MooncakeRecord, Rechunker, infer_parents, read_mooncake, rechunk
from dualpath.workloads.stats import mooncake_stats


def _line(ts=0, inp=1000, out=10, ids=(0, 1)):
    return json.dumps({"timestamp": ts, "input_length": inp, "output_length": out, "hash_ids": list(ids)})


def test_parse(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text(_line(1500, 1100, 7, (4, 5, 6)) + "\n\n" + _line(2000, 512, 0, (4,)) + "\n")
    assert read_mooncake(path) == (
        MooncakeRecord(1.5, 1100, 7, (4, 5, 6)),
        MooncakeRecord(2.0, 512, 0, (4,)),
    )


@pytest.mark.parametrize(
    "bad, problem",
    [
        ('{"timestamp": 0, "input_length": 5', "bad JSON"),
        ('"hello"', "expected a JSON object"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1}', "missing field(s) hash_ids"),
        ('{"input_length": 5, "output_length": 1, "hash_ids": [1]}', "missing field(s) timestamp"),
        (_line(ts=1.5), "timestamp must be an integer"),
        (_line(ts=-1), "timestamp must be >= 0"),
        (_line(inp="1000"), "input_length must be an integer"),
        (_line(inp=0, ids=()), "input_length must be >= 1"),
        (_line(out=-4), "output_length must be >= 0"),
        (_line(out=True), "output_length must be an integer"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": 3}', "hash_ids must be a list"),
        (_line(ids=(0, "x")), "hash_ids[1] must be an integer"),
        (_line(ids=(0, -2)), "hash_ids[1] must be >= 0"),
        (_line(inp=1025, ids=(0, 1)), "2 hash_ids for input_length 1025, expected ceil(1025 / 512) = 3"),
        (_line(inp=1024, ids=(0, 1, 2)), "3 hash_ids for input_length 1024, expected ceil(1024 / 512) = 2"),
    ],
)
def test_malformed_line_names_line(tmp_path, bad, problem):
    path = tmp_path / "m.jsonl"
    path.write_text(_line() + "\n" + _line() + "\n" + bad + "\n")
    with pytest.raises(InputError) as err:
        read_mooncake(path)
    assert str(err.value).startswith(f"{path} line 3: ")
    assert problem in str(err.value)


def test_rechunk_512_to_64_with_partial_last_block():
    r = Rechunker(64)
    # 1100 tokens: blocks 7 and 8 full (8 sub-blocks each); block 9 holds 76 tokens = 1 full sub-block.
    a = MooncakeRecord(0.0, 1100, 1, (7, 8, 9))
    assert r.rechunk(a) == tuple(range(17))
    # Same first two source blocks, then another one: shares exactly 16 sub-blocks.
    b = MooncakeRecord(0.0, 1536, 1, (7, 8, 10))
    assert r.rechunk(b) == tuple(range(16)) + tuple(range(24, 32))
    # Id 8 behind another first block is another prefix, so other sub-block ids.
    c = MooncakeRecord(0.0, 1024, 1, (5, 8))
    assert r.rechunk(c) == tuple(range(32, 48))
    # Deterministic: a fresh rechunker fed the same records gives the same ids.
    r2 = Rechunker(64)
    assert [r2.rechunk(x) for x in (a, b, c)] == [r.rechunk(x) for x in (a, b, c)]


def test_rechunk_short_prompt_has_no_full_block():
    assert rechunk(MooncakeRecord(0.0, 63, 1, (3,)), 64) == ()
    assert rechunk(MooncakeRecord(0.0, 64, 1, (3,)), 64) == (0,)


def test_rechunk_512_to_1024_merges_full_pairs_only():
    r = Rechunker(1024)
    # 2600 tokens: merged blocks [1,2] and [3,4] are full; [5,6] holds 552 tokens, dropped.
    assert r.rechunk(MooncakeRecord(0.0, 2600, 1, (1, 2, 3, 4, 5, 6))) == (0, 1)
    assert r.rechunk(MooncakeRecord(0.0, 2048, 1, (1, 2, 9, 10))) == (0, 2)
    assert r.rechunk(MooncakeRecord(0.0, 1023, 1, (1, 2))) == ()


def test_rechunk_512_keeps_full_blocks():
    assert rechunk(MooncakeRecord(0.0, 1100, 1, (7, 8, 9)), 512) == (0, 1)


@pytest.mark.parametrize("bt", [0, 96, 768, 1000])
def test_rechunk_bad_block_size(bt):
    with pytest.raises(InputError, match="block_tokens"):
        Rechunker(bt)


@given(
    shared=st.integers(0, 6),
    tail_a=st.integers(0, 4),
    tail_b=st.integers(0, 4),
    extra_a=st.integers(0, 511),
    extra_b=st.integers(0, 511),
    block_tokens=st.sampled_from([32, 64, 128, 256, 512]),
)
def test_rechunk_prefix_consistency(shared, tail_a, tail_b, extra_a, extra_b, block_tokens):
    """Two prompts that share `shared` source blocks share exactly the sub-blocks inside them."""
    ids_a = tuple(range(shared)) + tuple(range(100, 100 + tail_a))
    ids_b = tuple(range(shared)) + tuple(range(200, 200 + tail_b))
    if not ids_a or not ids_b:
        return
    a = MooncakeRecord(0.0, (len(ids_a) - 1) * 512 + 1 + extra_a, 1, ids_a)
    b = MooncakeRecord(0.0, (len(ids_b) - 1) * 512 + 1 + extra_b, 1, ids_b)
    r = Rechunker(block_tokens)
    xa, xb = r.rechunk(a), r.rechunk(b)
    assert len(xa) == a.input_tokens // block_tokens and len(set(xa)) == len(xa)
    common = 0
    while common < min(len(xa), len(xb)) and xa[common] == xb[common]:
        common += 1
    k = 512 // block_tokens
    # Shared source blocks that are full sub-blocks in both prompts.
    expected = min(shared * k, len(xa), len(xb))
    assert common == expected
    assert not set(xa[common:]) & set(xb)


def test_infer_parents_hand_case():
    recs = [
        MooncakeRecord(0.0, 1400, 5, (0, 1, 2)),  # full blocks [0, 1]
        MooncakeRecord(1.0, 1800, 5, (0, 1, 5, 6)),  # starts with r0's full blocks -> 0
        MooncakeRecord(2.0, 700, 5, (0, 9)),  # shares block 0 only: new conversation
        MooncakeRecord(3.0, 2000, 5, (0, 1, 5, 7)),  # r1's full blocks [0, 1, 5]: longest -> 1
        MooncakeRecord(4.0, 1024, 5, (0, 1)),  # r0's full blocks -> 0
        MooncakeRecord(5.0, 1100, 5, (0, 1, 3)),  # r0 and r4 both match: the latest -> 4
        MooncakeRecord(6.0, 1000, 5, (0, 1)),  # [0, 1] but block 1 is partial here: new
    ]
    assert infer_parents(recs) == (None, 0, None, 1, 0, 4, None)


def test_mooncake_stats_hand_case():
    recs = [
        MooncakeRecord(0.0, 1400, 10, (0, 1, 2)),
        MooncakeRecord(1.0, 1800, 20, (0, 1, 5, 6)),
        MooncakeRecord(2.0, 700, 30, (0, 9)),
    ]
    s = mooncake_stats(recs, block_tokens=512)
    assert s["num_requests"] == 3 and s["num_agents"] == 2
    assert s["mean_turns"] == 1.5
    assert s["mean_input_tokens"] == pytest.approx((1400 + 1800 + 700) / 3)
    # Conversation {r0, r1}: new tokens 1400 and 1800 - 2 * 512 = 776; conversation {r2}: 700.
    assert s["mean_append_tokens"] == pytest.approx(((1400 + 776) / 2 + 700) / 2)
    assert s["request_mean_append_tokens"] == pytest.approx((1400 + 776 + 700) / 3)
    assert s["mean_output_tokens"] == pytest.approx((15 + 30) / 2)
    assert s["mean_total_tokens"] == pytest.approx((1820 + 730) / 2)
    assert s["mean_context_tokens"] == pytest.approx((1600 + 700) / 2)
    # Full 512-blocks: r0 [0, 1] (0 hits), r1 [0, 1, 5] (2 hits), r2 [] (700 tokens: 1 block [0], hit).
    assert s["prefix_hit_ratio"] == pytest.approx((0 + 2 + 1) / (2 + 3 + 1))


def test_the_shipped_trace_slice_is_the_one_its_readme_describes():
    """The slice (workloads/data/README.md): the trace's records before 1,200,000 ms, each row's
    blocks as the trace format says; its sha256 is the README's, its statistics are pinned from
    this implementation's conversation rule (mooncake module docstring)."""
    readme = (MOONCAKE_SLICE.parent / "README.md").read_text()
    assert f"`{hashlib.sha256(MOONCAKE_SLICE.read_bytes()).hexdigest()}`" in readme
    recs = read_mooncake(MOONCAKE_SLICE)
    assert len(recs) == 3_658
    times_s = [r.timestamp_s for r in recs]
    assert times_s == sorted(times_s) and times_s[0] == 0.0 and times_s[-1] == 1199.999 < 1200.0
    assert all(len(r.block_ids) == math.ceil(r.input_tokens / 512) for r in recs)
    s = mooncake_stats(recs, block_tokens=64)
    assert s["num_requests"] == 3_658 and s["num_agents"] == 2_647
    assert s["mean_input_tokens"] == pytest.approx(13_403.12, abs=0.01)
    assert s["request_mean_output_tokens"] == pytest.approx(348.50, abs=0.01)
    assert s["prefix_hit_ratio"] == pytest.approx(0.3243, abs=1e-4)


def test_rescale_keeps_blocks_and_prefix_sharing_at_a_smaller_block():
    from dualpath.workloads import mooncake_stats, rescale

    recs = (
        MooncakeRecord(0.0, 1400, 300, (0, 1, 2)),  # 2 full blocks + 376 tokens
        MooncakeRecord(1.0, 1536, 1, (0, 1, 5)),  # 3 full blocks
        MooncakeRecord(2.0, 700, 0, (0, 9)),
    )
    small = rescale(recs, 64)
    # full blocks stay full; a partial block and the output shrink by 64 / 512 (at least 1 token)
    assert [(r.input_tokens, r.output_tokens, r.block_ids, r.block_tokens) for r in small] == [
        (2 * 64 + 47, 38, (0, 1, 2), 64), (3 * 64, 1, (0, 1, 5), 64), (64 + 24, 0, (0, 9), 64)]
    assert [r.num_full_blocks for r in small] == [r.num_full_blocks for r in recs]
    # the same sharing: one runtime block per trace block at 64 as at 512
    big, little = mooncake_stats(recs, 512), mooncake_stats(small, 64)
    assert little["prefix_hit_ratio"] == big["prefix_hit_ratio"] > 0
    assert little["num_agents"] == big["num_agents"]
    assert rechunk(small[1], 32) == rechunk(recs[1], 256)  # two blocks per trace block either way
    with pytest.raises(InputError, match="id space"):
        Rechunker(64).rechunk(small[0])
