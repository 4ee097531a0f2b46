"""Read-path choice (docs/paper.md §3.4): once a request has its PE and DE, its whole hit KV is read on
the side whose node has the shorter disk-read queue (tokens). Ties go to the PE side, which
needs no extra CNIC hop.

With a host-DRAM tier (`+dram`, core/dram.py) a side reads from storage only the hit blocks its
DRAM does not hold: each side costs its queue plus those tokens, and a side whose DRAM holds the
whole hit costs nothing (its read needs no SNIC, so it waits in no queue). Without a tier both
sides add the same hit, and the rule is the paper's."""

from __future__ import annotations

from ..snapshot import ReadSide


def choose_read_side(pe_node_queue_tokens: int, de_node_queue_tokens: int) -> ReadSide:
    if pe_node_queue_tokens < 0 or de_node_queue_tokens < 0:
        raise ValueError("read queues are non-negative token counts")
    return ReadSide.DECODE if de_node_queue_tokens < pe_node_queue_tokens else ReadSide.PREFILL


def side_cost_tokens(queue_tokens: int, storage_tokens: int) -> int:
    """A side's cost with a DRAM tier: its read queue plus what it must read from storage; nothing
    when its DRAM holds the whole hit."""
    if queue_tokens < 0 or storage_tokens < 0:
        raise ValueError("read queues and reads are non-negative token counts")
    return queue_tokens + storage_tokens if storage_tokens else 0
