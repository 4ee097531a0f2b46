"""The DRAM tier's ledger (core/dram.py: LruBytes) and the read-side rule that counts what each side's
tier holds (core/policy/read_side.py: side_cost_tokens; `+dram`)."""

from __future__ import annotations

import pytest

from dualpath.core.dram import LruBytes
from dualpath.core.policy import PrefillThresholds, side_cost_tokens
from dualpath.core.request import RequestId
from dualpath.core.scheduler import ClusterView, GlobalScheduler, SchedulerRules
from dualpath.core.snapshot import EngineLoad, QueuedRequest, ReadSide


def test_lru_evicts_the_least_recently_used_until_a_new_entry_fits():
    lru = LruBytes(100)
    assert lru.put("a", 40) == [] and lru.put("b", 40) == []
    assert lru.touch("a") and not lru.touch("z")  # a is now the most recent
    assert lru.put("c", 40) == ["b"]  # b, the oldest use, goes first
    assert "a" in lru and "c" in lru and "b" not in lru and lru.used_bytes == 80
    assert lru.put("d", 90) == ["a", "c"]
    assert lru.put("big", 101) == [] and "big" not in lru  # larger than the tier: not kept
    assert lru.put("d", 10) == [] and lru.used_bytes == 10  # a key put again replaces its entry
    assert lru.pop("d") == 10 and lru.pop("d") == 0 and lru.used_bytes == 0
    lru.check_invariants()
    lru.used_bytes = 5
    with pytest.raises(AssertionError, match="ledger off"):
        lru.check_invariants()
    with pytest.raises(ValueError):
        LruBytes(-1)


def test_a_sides_cost_is_its_queue_and_what_it_reads_from_storage():
    assert side_cost_tokens(5000, 1000) == 6000
    assert side_cost_tokens(5000, 0) == 0  # its DRAM holds the whole hit: no SNIC, no queue
    with pytest.raises(ValueError):
        side_cost_tokens(-1, 0)


class _View(ClusterView):
    def __init__(self, queues: dict[int, int], hit: int, held: dict[int, int]) -> None:
        self.queues, self.hit, self.held = queues, hit, held
        self.dram_asked = 0

    def pe_loads(self, group):
        return [EngineLoad(0, 0, 0, 0)]

    def de_loads(self, group):
        return [EngineLoad(1, 1, 0, 0, 10**9)]

    def read_queue_tokens(self, node):
        return self.queues[node]

    def read_tokens(self, ref):
        return self.hit

    def dram_tokens(self, ref, node, hit_tokens):
        assert hit_tokens == self.hit
        self.dram_asked += 1
        return self.held.get(node, 0)


def _decide(dram: bool, queues: dict[int, int], hit: int, held: dict[int, int]):
    s = GlobalScheduler([0], [1], SchedulerRules(PrefillThresholds(10**6, 10**6), dram_tier=dram))
    s.submit(QueuedRequest(RequestId(0, 0), hit + 100, 1000, hit + 110), "r")
    view = _View(queues, hit, held)
    p = s.schedule(view)
    (d,) = p.decode
    return d, view


@pytest.mark.parametrize("dram, queues, held, side", [
    (False, {0: 100, 1: 900}, {1: 4000}, ReadSide.PREFILL),  # the paper's rule: shorter queue; the tier unseen
    (True, {0: 100, 1: 900}, {1: 4000}, ReadSide.DECODE),  # the DE side holds the whole hit: it costs nothing
    (True, {0: 100, 1: 900}, {1: 3000}, ReadSide.DECODE),  # 900 + 1000 < 100 + 4000
    (True, {0: 100, 1: 900}, {1: 500}, ReadSide.PREFILL),  # 900 + 3500 > 100 + 4000
    (True, {0: 100, 1: 900}, {0: 500, 1: 1000}, ReadSide.PREFILL),  # 100 + 3500 < 900 + 3000
    (True, {0: 500, 1: 500}, {}, ReadSide.PREFILL),  # nothing held: the paper's rule, a tie to the PE
])
def test_the_read_side_counts_what_each_sides_dram_holds(dram, queues, held, side):
    d, view = _decide(dram, queues, 4000, held)
    assert d.side is side and d.read_tokens == 4000
    assert (view.dram_asked > 0) == dram  # without +dram the world is never asked
