"""A circuit breaker for the storage-service client (remote.py): a service that is dead or frozen
costs its callers one timeout, not one per call.

1. Closed: every call goes to the service.
2. A call that times out or cannot connect opens the breaker: for STORE_RETRY_AFTER_S every call
   is skipped at once (a lookup finds nothing, a read is a miss, a put is WRITE_FAILED) and
   counted by operation (`skipped`).
3. The first call after that period starts one probe on a thread of its own (the caller is still
   skipped, so the router's event loop never waits on it); the probe's success closes the
   breaker, its failure opens it for another period.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Callable

from dualpath.runtime.clock import Clock, MonotonicClock

# Back-off after a failed call. Long against a loopback or LAN call (milliseconds:
# docs/results/store/service_vs_local.json reads 183 blocks of 2.9 MB in ~0.3 s), so a frozen
# service costs the probe thread at most one store_timeout_s per period and the callers nothing;
# short against the engines' heartbeat timeout (RuntimeConfig.faults.heartbeat_timeout_s, 5 s), so
# a service that comes back serves hits again within about 2 s.
STORE_RETRY_AFTER_S = 2.0


class CircuitBreaker:
    """Thread-safe; `probe` is a call to the service that raises OSError when it fails."""

    def __init__(self, probe: Callable[[], object], retry_after_s: float = STORE_RETRY_AFTER_S,
                 clock: Clock | None = None) -> None:
        self._probe, self.retry_after_s = probe, retry_after_s
        self._clock = clock or MonotonicClock()
        self._lock = threading.Lock()
        self._open_until_s: float | None = None  # None: closed
        self._probing = False
        self.skipped: Counter[str] = Counter()  # op -> calls answered without the service
        self.trips = 0  # times the breaker opened

    @property
    def is_open(self) -> bool:
        return self._open_until_s is not None

    def allow(self, op: str) -> bool:
        """Whether a call of `op` may go to the service now; False counts it as skipped."""
        with self._lock:
            if self._open_until_s is None:
                return True
            self.skipped[op] += 1
            if self._probing or self._clock.now_s() < self._open_until_s:
                return False
            self._probing = True
        threading.Thread(target=self._run_probe, name="kvstore-remote-probe", daemon=True).start()
        return False

    def failed(self) -> None:
        """A call timed out or could not connect: open (or keep open) for a period."""
        with self._lock:
            if self._open_until_s is None:
                self.trips += 1
            self._open_until_s = self._clock.now_s() + self.retry_after_s

    def succeeded(self) -> None:
        with self._lock:
            self._open_until_s = None

    def _run_probe(self) -> None:
        try:
            self._probe()
        except OSError:
            self.failed()
        else:
            self.succeeded()
        finally:
            with self._lock:
                self._probing = False
