"""Token bucket: the rate of an emulated NIC (SNIC or CNIC) on one host.

Debt semantics: `reserve(n)` always grants the n bytes at once and lets the level go negative;
the returned wait is how long until the debt is paid, i.e. until the bytes have "passed" at the
configured rate. A caller that waits that long before sending the next bytes moves exactly
`burst_bytes + rate * elapsed` bytes by any time, never more. With `burst_bytes = 0` the bucket
is a serialising link: n bytes occupy it for n / rate seconds (how `LinkArbiter` uses it).

`rate_bytes_per_s = None` means unlimited (real speed): every wait is 0.

Invariant: level <= burst_bytes; the bucket only refills with time, and time never runs back.
"""

from __future__ import annotations

import threading

from ..clock import Clock


class TokenBucket:
    def __init__(self, rate_bytes_per_s: float | None, burst_bytes: int, clock: Clock) -> None:
        if rate_bytes_per_s is not None and not rate_bytes_per_s > 0:
            raise ValueError(f"rate_bytes_per_s must be positive or None (unlimited), got {rate_bytes_per_s}")
        if burst_bytes < 0:
            raise ValueError(f"burst_bytes must be >= 0, got {burst_bytes}")
        self.rate_bytes_per_s = rate_bytes_per_s
        self.burst_bytes = burst_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._level_bytes = float(burst_bytes)
        self._stamp_s = clock.now_s()
        self.granted_bytes = 0

    @property
    def unlimited(self) -> bool:
        return self.rate_bytes_per_s is None

    def reserve(self, nbytes: int, at_s: float | None = None) -> float:
        """Take `nbytes` now (or at time `at_s`, which must not precede an earlier call) and
        return the seconds from that time until they are paid for (0 if the bucket covered them)."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        with self._lock:
            self.granted_bytes += nbytes
            if self.rate_bytes_per_s is None:
                return 0.0
            t = self._clock.now_s() if at_s is None else at_s
            if t < self._stamp_s:
                raise ValueError(f"time ran backwards: {t} < {self._stamp_s}")
            rate = self.rate_bytes_per_s
            self._level_bytes = min(float(self.burst_bytes), self._level_bytes + rate * (t - self._stamp_s))
            self._stamp_s = t
            self._level_bytes -= nbytes
            return -self._level_bytes / rate if self._level_bytes < 0 else 0.0

    def consume(self, nbytes: int) -> None:
        """Blocking form of `reserve`: returns once the bytes are paid for."""
        self._clock.sleep_s(self.reserve(nbytes))

    def check_invariants(self) -> None:
        with self._lock:
            assert self._level_bytes <= self.burst_bytes, "token level above burst"
            assert self.granted_bytes >= 0
