"""Compute-quota batching with chunked prefill (docs/paper.md §3.5)."""

from dualpath.core.policy import Budget, form_prefill_batch
from dualpath.core.request import RequestId
from dualpath.core.snapshot import BatchCandidate


def cands(*specs):
    return [BatchCandidate(RequestId(i, 0), c, r) for i, (c, r) in enumerate(specs)]


# cost in "ms": 1 per computed token plus 0.01 per (cached x computed) / 100 -> attention-like
def attn_ms(cached, n):
    return n * (1 + cached / 10000)


QUOTA = [Budget("quota", attn_ms, 300.0)]


def test_whole_requests_while_they_fit_then_a_binary_searched_chunk():
    # r0: 100 tokens at 0 cached = 100 ms; r1: 100 at 10000 cached = 200 ms -> 300 total (fits exactly)
    # r2: 50 tokens at 0 cached -> no room left: batch closes without it
    out = form_prefill_batch(cands((0, 100), (10000, 100), (0, 50)), QUOTA)
    assert [(e.rid.agent, e.compute_tokens) for e in out] == [(0, 100), (1, 100)]


def test_last_request_is_chunked_to_the_largest_size_that_fits():
    # r0 = 250 ms; r1 needs 2 ms/token (cached 10000): remaining 50 ms -> 25 tokens
    out = form_prefill_batch(cands((0, 250), (10000, 100), (0, 1)), QUOTA)
    assert [(e.rid.agent, e.cached_tokens, e.compute_tokens) for e in out] == [(0, 0, 250), (1, 10000, 25)]


def test_a_request_bigger_than_the_quota_is_chunked_alone():
    out = form_prefill_batch(cands((0, 1000)), QUOTA)
    assert [(e.compute_tokens) for e in out] == [300]


def test_progress_rule_takes_one_token_when_nothing_fits():
    huge = [Budget("quota", lambda c, n: 1000.0 * n, 300.0)]
    out = form_prefill_batch(cands((0, 5)), huge)
    assert [e.compute_tokens for e in out] == [1]


def test_all_budgets_must_hold():
    tokens = Budget("tokens", lambda c, n: n, 120)
    hbm = Budget("hbm", lambda c, n: c + n, 1000)
    # r0: tokens 50, hbm 550 (500 cached). r1 full (60 tokens, 560 hbm) breaks hbm (1110) ->
    # chunk: hbm allows 1000 - 550 - 500 = -50 -> no chunk fits -> r1 excluded
    out = form_prefill_batch(cands((500, 50), (500, 60)), [tokens, hbm])
    assert [(e.rid.agent, e.compute_tokens) for e in out] == [(0, 50)]
    # with room for hbm, tokens bind: 120 - 50 = 70 left, r1 (60) fits whole, r2 chunked to 10
    hbm2 = Budget("hbm", lambda c, n: c + n, 10**6)
    out = form_prefill_batch(cands((500, 50), (500, 60), (0, 40)), [tokens, hbm2])
    assert [(e.rid.agent, e.compute_tokens) for e in out] == [(0, 50), (1, 60), (2, 10)]


def test_without_chunking_the_batch_stops_at_the_first_misfit():
    out = form_prefill_batch(cands((0, 250), (0, 100)), QUOTA, allow_chunking=False)
    assert [e.compute_tokens for e in out] == [250]
