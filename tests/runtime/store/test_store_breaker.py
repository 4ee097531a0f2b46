"""The storage-service client's circuit breaker (store/breaker.py): a frozen (SIGSTOP) or dead
(SIGKILL) service costs the caller one timeout, then calls are answered at once (lookup 0, read
a miss, put an error) and counted, and a probe brings the service back once it answers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from dualpath.runtime.clock import ManualClock
from dualpath.runtime.router.placement import Placement
from dualpath.runtime.store.breaker import CircuitBreaker
from dualpath.runtime.store.remote import RemoteStore, RemoteStoreError
from store_helpers import DTYPE, FINGERPRINT, LAYOUT, chain, payloads

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT_S = 0.5


def test_the_breaker_skips_for_its_period_then_one_probe_decides():
    clock, probes, answer = ManualClock(), [], [OSError("still down")]
    done = threading.Event()

    def probe() -> None:
        probes.append(clock.now_s())
        try:
            if answer:
                raise answer.pop()
        finally:
            done.set()

    b = CircuitBreaker(probe, retry_after_s=2.0, clock=clock)
    assert b.allow("lookup") and not b.is_open
    b.failed()
    assert [b.allow("lookup") for _ in range(3)] == [False] * 3 and probes == []  # within the period: no probe
    clock.advance(2.0)
    assert not b.allow("put")  # the caller is skipped; the probe runs on its own thread
    assert done.wait(5) and probes == [2.0]
    deadline = time.monotonic() + 5
    while b._probing and time.monotonic() < deadline:
        time.sleep(0.01)
    assert b.is_open and not b.allow("get") and len(probes) == 1  # failed: open for another period
    done.clear()
    clock.advance(2.0)
    assert not b.allow("get") and done.wait(5)
    deadline = time.monotonic() + 5
    while b.is_open and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not b.is_open and b.allow("lookup") and len(probes) == 2
    assert dict(b.skipped) == {"lookup": 3, "put": 1, "get": 2} and b.trips == 1


@pytest.fixture
def child(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, os.path.join(HERE, "service_child.py"), str(tmp_path / "svc"), "0"],
                            stdout=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("listening on tcp://127.0.0.1:"), line
    yield proc, int(line.split(":")[-1])
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait(10)


def _stop(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGSTOP, then wait until the kernel shows the process stopped (state T): the signal is
    asynchronous, and a busy machine may let the service answer one more call first."""
    proc.send_signal(signal.SIGSTOP)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.005)
    raise AssertionError(f"service {proc.pid} not stopped within {timeout_s} s")


def _client(port: int, retry_after_s: float) -> RemoteStore:
    return RemoteStore("127.0.0.1", port, LAYOUT, FINGERPRINT, DTYPE, timeout_s=TIMEOUT_S, retry_after_s=retry_after_s)


def test_a_frozen_service_costs_n_lookups_one_timeout_and_a_probe_brings_it_back(child):
    proc, port = child
    digests, data = chain(4), payloads(4)
    with _client(port, retry_after_s=1.0) as store:
        store.put_many(zip(digests, data))
        placement = Placement(store, {}, LAYOUT.block_tokens)
        prompt = list(range(4 * LAYOUT.block_tokens + 1))
        _stop(proc)
        t0 = time.monotonic()
        assert store.lookup(digests) == 0  # this one waits its timeout
        first_s = time.monotonic() - t0
        for _ in range(20):  # the router's lookups of 20 requests: answered at once
            assert placement.lookup(prompt, placement.digests(prompt)) == 0 and store.lookup(digests) == 0
        assert store.read_into(digests, bytearray(4 * LAYOUT.full_block_bytes)) == 0
        with pytest.raises(RemoteStoreError, match="skipped"):
            store.put(chain(1, seed=5)[0], data[0])
        total_s = time.monotonic() - t0
        assert TIMEOUT_S * 0.9 <= first_s < 2 * TIMEOUT_S and total_s < first_s + TIMEOUT_S, (first_s, total_s)
        assert store.skipped_calls() == {"lookup": 40, "get": 1, "put": 1}
        proc.send_signal(signal.SIGCONT)
        time.sleep(1.1)  # the period ends: the next call starts the probe
        assert store.lookup(digests) == 0
        deadline = time.monotonic() + 10
        while store.breaker.is_open and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.lookup(digests) == 4  # back: the hit is served again
        out = bytearray(4 * LAYOUT.full_block_bytes)
        assert store.read_into(digests, out) == 4 and bytes(out) == b"".join(data)


def test_a_killed_service_is_refused_fast_and_skipped_thereafter(child):
    proc, port = child
    digests, data = chain(2), payloads(2)
    with _client(port, retry_after_s=30.0) as store:
        store.put_many(zip(digests, data))
        proc.kill()
        proc.wait(10)
        t0 = time.monotonic()
        assert [store.lookup(digests) for _ in range(10)] == [0] * 10
        with pytest.raises(RemoteStoreError):
            store.put_many(zip(digests, data))
        assert time.monotonic() - t0 < TIMEOUT_S  # refused at once, no timeout to wait
        assert store.breaker.trips == 1 and store.skipped_calls() == {"lookup": 9, "put": 1}
        with pytest.raises(RemoteStoreError, match="skipped"):
            store.stats()  # the service's own counters are out of reach too, and say so at once


def test_skipped_calls_and_failed_persists_reach_the_router_metrics_and_prometheus():
    from dualpath.metrics.prometheus import render
    from dualpath.runtime.protocol import Counters
    from dualpath.runtime.router.metrics import QueueGauges, RouterMetrics

    class Client:  # a RemoteStore whose breaker skipped five lookups and a get
        def skipped_calls(self) -> dict[str, int]:
            return {"lookup": 5, "get": 1}

    m = RouterMetrics(ManualClock(), lambda: Client())
    m.persist_failures = 2
    for engine, skipped in ((0, 3), (1, 4)):
        m.counters(Counters(engine, 0, 0, 0.0, 0, 0, 0.0, 0, store_skipped_calls=skipped))
    assert m.store_faults() == {"persist_failures": 2, "router_skipped_lookups": 5, "router_skipped_calls": 6,
                                "engine_skipped_calls": 7}
    assert m.summary()["store"] == m.store_faults()
    text = render(*m.families(QueueGauges(0, 0, 0, (), None)))
    assert "dualpath_store_persist_failures_total 2" in text
    assert 'dualpath_store_calls_skipped_total{client="router"} 6' in text
    assert 'dualpath_store_calls_skipped_total{client="engines"} 7' in text
    assert RouterMetrics(ManualClock()).store_faults()["router_skipped_calls"] == 0  # a local store: nothing skipped
