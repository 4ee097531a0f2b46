"""One emulated link (a node's CNIC direction, or its SNIC) with two lanes (docs/paper.md §2.2-2.3).

Lifecycle of a transfer:
1. `submit(lane, nbytes, do_chunk)` queues it on its lane (FIFO) and returns a `TransferHandle`;
   the submission time (from the injected clock) is its arrival.
2. The link's thread decides the link's chunks with `DeficitRoundRobin`: the chunk starting at
   link time T is chosen among transfers that arrived by T, latency-critical vs KV by byte-weighted
   round robin (default 99:1), so a latency-critical arrival waits at most one KV chunk.
3. A chunk of n bytes occupies the link for n / rate (the link's token bucket, burst 0).
4. The thread calls `do_chunk(offset, n)` for the bytes, a numpy/torch copy between
   shared-memory buffers that releases the GIL.
5. After the last chunk, once real time has reached its delivery time, the handle completes with
   a `TransferResult` and the `on_done` callback runs on the link's thread (keep it short).
6. `close(drain_s)` sends what is queued for up to `drain_s`, lets decided chunks finish, fails
   queued transfers with `TransferFailed` and joins.

Rate-limited links run on link time: the thread wakes, decides every chunk that starts between the
last decision and now (all arrivals up to now are known, so this is the ideal link's schedule
whatever the OS's sleep overshoot), then copies them, merging consecutive chunks of one transfer
into one `do_chunk` call (arbitration is per chunk; copies need not be). If the thread falls more
than `max_lag_s` behind (the host cannot copy at the link's rate, or it was descheduled), the
link loses that time (`LinkStats.stalled_s`): the emulated link is never faster than the host.
`max_lag_s=None` never drops time (deterministic tests with a ManualClock).

Unlimited links (rate None) run on real time at copy speed. When no other lane holds a transfer,
one decision grants a run of up to `max_run_bytes` of the head transfer (`DeficitRoundRobin.next_run`);
the thread copies it chunk by chunk with no locking or scheduling between chunks, and checks after
each chunk whether the other lane got a transfer: if so it stops there and hands the rest back, so
a latency-critical arrival still waits at most one KV chunk (real time: chunk / copy speed). Copy
speed then depends on the chunk and on `do_chunk`'s cost per call (`transfer.ContiguousCopy`: one
memmove); see DEFAULT_CHUNK_BYTES.

`fifo=True` serves every lane from one FIFO queue (the baseline without lanes); byte counters
still count by the submitted lane.

Ledger per lane (check_invariants): submitted = sent + queued + in flight (decided, not yet
copied) + dropped (failed or cancelled).
"""

from __future__ import annotations

import heapq
import threading
from dataclasses import dataclass
from typing import Callable

from ...core.lanes import Lane, LaneWeights
from ..clock import Clock
from .drr import ChunkGrant, DeficitRoundRobin
from .token_bucket import TokenBucket
from .transfer import ArbiterClosed, DoChunk, LinkStats, TransferFailed, TransferHandle, TransferResult

# A latency-critical transfer waits at most one KV chunk: with 64 KiB bursts, (burst + chunk) / burst
# <= 1.125 needs chunk <= 8 KiB (the lanes acceptance allows 1.2, i.e. <= 12.8 KiB: too tight for
# host jitter). On a rate-limited link the chunk costs nothing (copies are merged); at real speed
# every chunk is one `do_chunk` call (~1 us of Python), so large transfers over unlimited links
# copy faster with larger chunks (`bench.REAL_SPEED_CHUNK_BYTES`).
DEFAULT_CHUNK_BYTES = 8 * 1024
DEFAULT_MAX_RUN_BYTES = 64 * 1024 * 1024  # unlimited links: bytes granted per decision at most (bounds close())
DEFAULT_MAX_LAG_S = 0.010  # host jitter (thread descheduled, GIL) the emulation absorbs before the link loses time
_EPS_S = 1e-9
DRAIN_POLL_S = 0.005  # close(drain_s): how often it looks whether the link is idle


def _pair(xs: list[int] | list[float]) -> tuple:
    return (xs[0], xs[1])


@dataclass(slots=True)
class _Run:
    """Consecutive chunks of one transfer on the link: bytes [offset, offset + nbytes)."""

    handle: TransferHandle
    offset_bytes: int
    nbytes: int
    start_s: float
    finish_s: float
    is_last: bool
    contender_arrivals: int = 0  # unlimited links: the other lane's transfers pushed when decided


class LinkArbiter:
    """A link's traffic manager: one thread serving two lanes in bounded chunks, rate-limited."""

    def __init__(self, name: str, rate_bytes_per_s: float | None, weights: LaneWeights, clock: Clock,
                 chunk_bytes: int = DEFAULT_CHUNK_BYTES, fifo: bool = False,
                 max_lag_s: float | None = DEFAULT_MAX_LAG_S, max_run_bytes: int = DEFAULT_MAX_RUN_BYTES) -> None:
        if max_run_bytes <= 0:
            raise ValueError(f"max_run_bytes must be positive, got {max_run_bytes}")
        self.name = name
        self.rate_bytes_per_s = rate_bytes_per_s
        self.chunk_bytes = chunk_bytes
        self.fifo = fifo
        self.max_lag_s = max_lag_s
        self.max_run_bytes = max_run_bytes
        self._clock = clock
        self._bucket = TokenBucket(rate_bytes_per_s, 0, clock)
        lanes = (Lane.KV,) if fifo else (Lane.LATENCY_CRITICAL, Lane.KV)
        self._sched: DeficitRoundRobin[TransferHandle] = DeficitRoundRobin(weights, chunk_bytes, lanes)
        # transfers pushed per scheduler lane (read without the lock by the copy loop of a run),
        # and for each lane the other lane whose arrivals cut a run short (none in FIFO mode)
        self._arrivals = [0, 0]
        self._contender: dict[Lane, Lane | None] = {
            lane: next((other for other in lanes if other != lane), None) for lane in lanes}
        self._cv = threading.Condition()
        self._closing = False
        self._link_free_s = clock.now_s()
        self._last_arrival_s = self._link_free_s
        self._submitted, self._sent, self._queued, self._in_flight, self._dropped = ([0, 0] for _ in range(5))
        self._completed = [0, 0]
        self._open = 0  # transfers submitted whose handle has not completed (callback included)
        self._delay_sum = [0.0, 0.0]
        self._delay_max = [0.0, 0.0]
        self._busy_s = 0.0
        self._stalled_s = 0.0
        self._due: list[tuple[float, int, _Run]] = []  # completions waiting for real time; thread-local
        self._seq = 0
        self._thread = threading.Thread(target=self._run, name=f"link-{name}", daemon=True)
        self._thread.start()

    def submit(self, lane: Lane, nbytes: int, do_chunk: DoChunk,
               on_done: Callable[[TransferResult], None] | None = None) -> TransferHandle:
        """Queue `nbytes` on `lane`. `do_chunk(offset, n)` is called on the link's thread for
        consecutive half-open ranges covering [0, nbytes) in order: at most `chunk_bytes` each on
        an unlimited link; on a rate-limited one, chunks consecutive on the link are merged.
        `transfer.ContiguousCopy` is the cheapest `do_chunk` between two contiguous arrays."""
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        with self._cv:
            if self._closing:
                raise ArbiterClosed(f"link {self.name} is closed")
            now = max(self._clock.now_s(), self._last_arrival_s)  # stamped under the lock: see _plan
            self._last_arrival_s = now
            handle = TransferHandle(Lane(lane), nbytes, now, do_chunk, on_done)
            sched_lane = Lane.KV if self.fifo else handle.lane
            self._sched.push(sched_lane, handle, nbytes, now)
            self._arrivals[sched_lane] += 1
            self._submitted[handle.lane] += nbytes
            self._queued[handle.lane] += nbytes
            self._open += 1
            self._cv.notify()
        return handle

    def stats(self) -> LinkStats:
        with self._cv:
            return LinkStats(self.name, _pair(self._sent), _pair(self._queued), _pair(self._completed),
                             _pair(self._delay_sum), _pair(self._delay_max), self._busy_s, self._stalled_s)

    def check_invariants(self) -> None:
        with self._cv:
            self._sched.check_invariants()
            self._bucket.check_invariants()
            queued = sum(self._sched.queued_bytes(lane) for lane in self._sched.lanes)
            assert queued == sum(self._queued), "queued bytes disagree with the scheduler"
            for i in (0, 1):
                parts = (self._sent[i], self._queued[i], self._in_flight[i], self._dropped[i])
                assert self._submitted[i] == sum(parts), f"byte ledger broken on lane {Lane(i).name}"
                assert min(parts) >= 0, f"negative bytes on lane {Lane(i).name}"
            assert self._open >= 0, "more transfers completed than submitted"

    def idle(self) -> bool:
        """Nothing queued, decided or waiting for its delivery time: every transfer has completed."""
        with self._cv:
            return self._open == 0

    def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every submitted transfer to complete (callbacks included);
        whether they have. New submissions meanwhile are waited for too."""
        deadline_s = self._clock.now_s() + timeout_s
        while not self.idle():
            if self._clock.now_s() >= deadline_s:
                return False
            self._clock.sleep_s(DRAIN_POLL_S)
        return True

    def close(self, drain_s: float = 0.0) -> None:
        """Send what is queued for up to `drain_s` (an engine that stops lets its persists' copies
        finish), then let decided chunks finish, fail what is still queued with `TransferFailed`
        and join the thread."""
        self.drain(drain_s)
        with self._cv:
            drained = [] if self._closing else self._sched.drain()
            self._closing = True
            for h, unsent_bytes in drained:
                self._queued[h.lane] -= unsent_bytes
                self._dropped[h.lane] += unsent_bytes
            self._cv.notify_all()
        for h, _ in drained:
            self._finished(h, None, TransferFailed(f"link {self.name} closed before the transfer finished"))
        self._thread.join()

    def __enter__(self) -> "LinkArbiter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- the link's thread -------------------------------------------------------------------

    def _run(self) -> None:
        unlimited = self._bucket.unlimited
        while True:
            runs = self._wait_and_plan()
            if runs is None:
                return
            if unlimited:
                self._copy_run(runs[0])
            else:
                self._copy(runs)

    def _wait_and_plan(self) -> list[_Run] | None:
        """Block until chunks are due on the link and return them; None once closed and idle."""
        while True:
            self._notify_due()
            with self._cv:
                if self._sched.has_pending():
                    now = self._clock.now_s()
                    runs = self._plan(now)
                    if runs:
                        return runs
                    arrival = self._sched.earliest_arrival_s()
                    wake_s = max(self._link_free_s, now if arrival is None else arrival)
                elif self._due:
                    now, wake_s = self._clock.now_s(), self._due[0][0]
                elif self._closing:
                    return None
                else:
                    self._cv.wait()
                    continue
                if self._due:
                    wake_s = min(wake_s, self._due[0][0])
            self._clock.sleep_s(wake_s - now + _EPS_S)

    def _plan(self, now: float) -> list[_Run]:
        """Decide the chunks that start before `now` (under the lock: every arrival stamped
        before `now` is queued, later ones are stamped >= now)."""
        if self._bucket.unlimited:
            t = max(self._link_free_s, now)
            g = self._sched.next_run(t, self.max_run_bytes)
            if g is None:
                return []
            run = self._take(g, t, t)  # finish set after the copy
            contender = self._contender[g.lane]
            if contender is not None:
                run.contender_arrivals = self._arrivals[contender]  # under the lock: none missed
            return [run]
        arrival = self._sched.earliest_arrival_s()
        assert arrival is not None
        t = max(self._link_free_s, arrival)
        if self.max_lag_s is not None and now - t > self.max_lag_s:
            self._stalled_s += now - self.max_lag_s - t
            t = now - self.max_lag_s
        runs: list[_Run] = []
        while t < now:
            g = self._sched.next_chunk(t, merge_until_s=now, bytes_per_s=self.rate_bytes_per_s)
            if g is None:  # the link idles until the next arrival
                a = self._sched.earliest_arrival_s()
                if a is None or a >= now:
                    break
                t = a
                continue
            finish = t + self._bucket.reserve(g.nbytes, at_s=t)
            prev = runs[-1] if runs else None
            if prev is not None and prev.handle is g.item and prev.offset_bytes + prev.nbytes == g.offset_bytes:
                self._take(g, t, finish)
                prev.nbytes += g.nbytes
                prev.finish_s, prev.is_last = finish, g.is_last
            else:
                runs.append(self._take(g, t, finish))
            t = finish
        self._link_free_s = max(self._link_free_s, t)
        return runs

    def _take(self, g: ChunkGrant[TransferHandle], start_s: float, finish_s: float) -> _Run:
        h = g.item
        if h._started_s is None:
            h._started_s = start_s
        self._queued[h.lane] -= g.nbytes
        self._in_flight[h.lane] += g.nbytes
        self._busy_s += finish_s - start_s
        return _Run(h, g.offset_bytes, g.nbytes, start_s, finish_s, g.is_last)

    def _copy(self, runs: list[_Run]) -> None:
        failed: dict[int, BaseException] = {}
        for r in runs:
            h = r.handle
            if id(h) in failed:  # decided after the chunk that failed: never sent
                self._drop(h, r.nbytes, failed[id(h)])
                continue
            try:
                h._do_chunk(r.offset_bytes, r.nbytes)
            except BaseException as e:  # reported through the handle; the link keeps going
                failed[id(h)] = e
                r.is_last = False
                self._drop(h, r.nbytes, e)
                continue
            with self._cv:
                self._in_flight[h.lane] -= r.nbytes
                self._sent[h.lane] += r.nbytes
                if r.is_last:
                    self._count_completion(h)
            if r.is_last:
                self._seq += 1
                heapq.heappush(self._due, (r.finish_s, self._seq, r))

    def _copy_run(self, r: _Run) -> None:
        """Copy an unlimited link's run (`DeficitRoundRobin.next_run`) chunk by chunk; stop early,
        handing the rest back, if the other lane got a transfer (unless the link is closing:
        then the decided run finishes)."""
        h = r.handle
        contender = self._contender[Lane.KV if self.fifo else h.lane]
        arrivals = self._arrivals
        seen = r.contender_arrivals
        do_chunk = h._do_chunk
        offset, end = r.offset_bytes, r.offset_bytes + r.nbytes
        error: BaseException | None = None
        ended = False
        try:
            for n in self._sched.run_pieces():
                do_chunk(offset, n)
                offset += n
                if contender is not None and arrivals[contender] != seen and offset < end:
                    with self._cv:
                        if not self._closing:
                            back = self._sched.end_run(offset - r.offset_bytes)
                            self._in_flight[h.lane] -= back
                            self._queued[h.lane] += back
                            r.nbytes -= back
                            r.is_last = False
                            ended = True
                            break
                    seen = arrivals[contender]
        except BaseException as e:  # reported through the handle; the link keeps going
            error = e
        sent = offset - r.offset_bytes
        with self._cv:
            if not ended:
                self._sched.end_run(r.nbytes)
            r.finish_s = max(r.start_s, self._clock.now_s())  # real speed: the link was busy for the copy
            self._busy_s += r.finish_s - r.start_s
            self._link_free_s = r.finish_s
            self._in_flight[h.lane] -= sent
            self._sent[h.lane] += sent
            if error is None and r.is_last:
                self._count_completion(h)
        if error is not None:
            self._drop(h, r.nbytes - sent, error)
        elif r.is_last:
            self._seq += 1
            heapq.heappush(self._due, (r.finish_s, self._seq, r))

    def _drop(self, h: TransferHandle, in_flight_bytes: int, error: BaseException) -> None:
        with self._cv:
            self._in_flight[h.lane] -= in_flight_bytes
            unsent = self._sched.drop(h)
            self._queued[h.lane] -= unsent
            self._dropped[h.lane] += in_flight_bytes + unsent
        self._finished(h, None, error)

    def _finished(self, h: TransferHandle, result: TransferResult | None, error: BaseException | None) -> None:
        """Complete `h` (its callback run), then count it closed (once: a failing one may come twice)."""
        if h._finish(result, error):
            with self._cv:
                self._open -= 1

    def _count_completion(self, h: TransferHandle) -> None:
        assert h._started_s is not None
        delay = h._started_s - h.submitted_s
        self._completed[h.lane] += 1
        self._delay_sum[h.lane] += delay
        self._delay_max[h.lane] = max(self._delay_max[h.lane], delay)

    def _notify_due(self) -> None:
        if not self._due:
            return
        now = self._clock.now_s()
        while self._due and self._due[0][0] <= now:
            _, _, r = heapq.heappop(self._due)
            h = r.handle
            assert h._started_s is not None
            self._finished(h, TransferResult(h.lane, h.nbytes, h.submitted_s, h._started_s, r.finish_s, now), None)
