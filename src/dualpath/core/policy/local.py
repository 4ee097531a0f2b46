"""Decode-local prefill for short appends (`selective`, `+selective` after any mode; beyond the
paper; docs/paper.md "Beyond the paper").

The field's answer to agentic appends: a prefix-aware decider keeps a request on a decode engine
when the tokens it must compute are few, instead of sending it through a prefill engine. The DE
reads the request's hit through its own node's SNIC, prefills the append itself (a chunk carried
by its decode steps, as chunked prefill runs in a decode batch) and decodes. No PE takes it, and no
KV crosses between engines.

The rule, at arrival: the request is prefilled locally when its uncached tokens (prompt minus the
hit the world expects, `QueuedRequest.uncached_tokens`) are at most `max_tokens`. It then skips the
global PE queue and joins the DE queue at once, where the DE selection (DualPath's two phases, or
round robin) chooses its DE as for any request; its read goes to the DE's node, charged to that
node's read queue. A hit found shorter at placement leaves the DE more to compute, never a wrong
answer.

Bound: a local request costs its DE's batch one chunk of at most `max_tokens` prompt tokens per
step (sim/decode.py), so every running request's step is slowed by at most one such chunk per local
request the DE prefills at once.
"""

from __future__ import annotations

from typing import Final

# choice: one block (64 tokens, docs/paper.md §1.5): the threshold with the lowest JCT for
# dualpath+selective at 64K on both of Fig. 7's DeepSeek clusters in the sweep of
# `dualpath repro --only selective` (docs/results.md; 32 to 2,048 tokens). llm-d's simulator studies
# use 512 (docs/paper.md §10), in the sweep too.
LOCAL_PREFILL_MAX_TOKENS_DEFAULT: Final = 64


def prefill_locally(max_tokens: int, uncached_tokens: int | None) -> bool:
    """Whether a request whose `uncached_tokens` are expected (None: unknown) is prefilled on its DE."""
    return uncached_tokens is not None and uncached_tokens <= max_tokens
