"""Read or recompute (core/policy/recompute.py): the rule's arithmetic, the scheduler's
use of it, and the simulator modelling a slow store with it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dualpath.config import SimConfig, WorkloadConfig, paper_cluster, parse_mode
from dualpath.core.policy import RecomputeRule, should_recompute
from dualpath.core.policy.recompute import read_s, recompute_s
from dualpath.sim.runner import run_modes

# 1,000 KV bytes per token read at 1 MB/s: 1 ms per token; recomputed at 500 tokens/s: 2 ms per token
RULE = RecomputeRule(kv_bytes_per_token=1000, read_bytes_per_s=1e6, recompute_tokens_per_s=500.0)


def test_a_store_that_answers_late_is_worth_recomputing_for():
    assert read_s(RULE, 1000, 0.0) == pytest.approx(1.0) and recompute_s(RULE, 1000) == pytest.approx(2.0)
    assert not should_recompute(RULE, 1000, 0.0)  # reading at line rate is the cheaper path
    assert not should_recompute(RULE, 1000, 0.99)  # 1.99 s of read against 2 s of compute
    assert should_recompute(RULE, 1000, 1.01)  # 2.01 s against 2 s
    assert should_recompute(RULE, 64, 0.5) and not should_recompute(RULE, 2000, 0.5)  # a small hit first
    assert not should_recompute(RULE, 0, 100.0)  # nothing to read, nothing to decide
    with pytest.raises(ValueError):
        should_recompute(RULE, 10, -1.0)
    with pytest.raises(ValueError):
        RecomputeRule(1000, 0.0, 500.0)


def _cfg(latency_s: float, rule_on: bool) -> SimConfig:
    cfg = SimConfig(cluster=paper_cluster("ds-27b", "1P1D"), workload=WorkloadConfig(max_len_tokens=32 * 1024, num_agents=16, seed=3))
    return replace(cfg, cluster=replace(cfg.cluster, storage_read_latency_s=latency_s),
                   scheduler=replace(cfg.scheduler, recompute_when_faster=rule_on))


def _run(latency_s: float, rule_on: bool, mode: str = "dualpath") -> dict:
    return run_modes(_cfg(latency_s, rule_on), [mode])["runs"][0]


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_the_simulated_slow_store_recomputes_and_finishes_sooner(mode):
    parse_mode(mode)
    fast, slow_read, slow_recompute = _run(0.0, True, mode), _run(5.0, False, mode), _run(5.0, True, mode)
    # a store at line rate: the rule never fires, and changes nothing
    assert fast["scheduler"]["recomputed_hits"] == 0
    assert fast["jct_s"] == _run(0.0, False, mode)["jct_s"]
    # 5 s before every read's first byte: waiting costs, recomputing saves most of it
    assert slow_read["jct_s"] > fast["jct_s"]
    assert slow_recompute["scheduler"]["recomputed_hits"] > 0
    assert slow_recompute["jct_s"] < slow_read["jct_s"]
    assert slow_recompute["bytes"]["storage_to_prefill"] + slow_recompute["bytes"]["storage_via_decode"] < \
        slow_read["bytes"]["storage_to_prefill"] + slow_read["bytes"]["storage_via_decode"]
    assert "recomputed_hits" not in slow_read["scheduler"]  # off: the result is what it always was


def test_a_negative_store_delay_is_refused():
    from dualpath.config import FaultConfig, RuntimeConfig
    from dualpath.errors import InputError

    with pytest.raises(InputError, match="store_read_delay_s must be >= 0"):
        RuntimeConfig(model="tiny", faults=FaultConfig(store_read_delay_s=-1.0))
