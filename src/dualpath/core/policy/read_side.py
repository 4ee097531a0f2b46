"""Read-path choice (docs/paper.md §3.4): once a request has its PE and DE, its whole hit KV is read on
the side whose node has the shorter disk-read queue (tokens). Ties go to the PE side, which
needs no extra CNIC hop."""

from __future__ import annotations

from ..snapshot import ReadSide


def choose_read_side(pe_node_queue_tokens: int, de_node_queue_tokens: int) -> ReadSide:
    if pe_node_queue_tokens < 0 or de_node_queue_tokens < 0:
        raise ValueError("read queues are non-negative token counts")
    return ReadSide.DECODE if de_node_queue_tokens < pe_node_queue_tokens else ReadSide.PREFILL
