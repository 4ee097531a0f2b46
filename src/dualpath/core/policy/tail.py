"""Tail-aware PE fetch (`+tail`, beyond the paper; docs/guide/simulator.md): a burst spread over
every open PE group instead of the first one to fetch.

Algorithm 1 (prefill.py) lets the group that fetches first take FIFO requests until each of its
engines is over beta, and beta counts a request's tokens whether cached or not. When many requests
arrive at once (every agent's first turn at an offline start, a wave of tool results) and fit under
one group's caps, that group takes all of them: its SNIC reads and its forwards serve the whole
burst while the other groups idle, and the burst's last TTFT is several times what it is on a
deployment of one group (tests/sim/test_start_burst.py).

The rule, per scheduling pass, with W requests waiting and G PE groups open (an engine at or
under beta):

  1. capped sweep: each open group, in the pass's rotation, runs its selection (Algorithm 1 or
     round robin, unchanged) on at most ceil(W / G) requests from the head of the queue;
  2. then, if requests still wait, an uncapped sweep over the groups still open, as without the rule.

FIFO order is kept (each group takes a prefix of what is left). Bound: the rule is work-conserving
within a pass: a request stays queued at the pass's end only if every group is closed, as under
Algorithm 1, so it never holds back a request that Algorithm 1 could place now; with W <= 1 or a
single open group it changes nothing.
"""

from __future__ import annotations


def share_cap(waiting: int, open_groups: int) -> int | None:
    """The capped sweep's per-group cap, or None where the rule changes nothing."""
    if waiting <= 1 or open_groups <= 1:
        return None
    return -(-waiting // open_groups)
