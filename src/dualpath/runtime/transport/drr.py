"""Deficit round robin over lanes, by bytes: the arbitration policy of `LinkArbiter`.

Pure (no clock, no threads): the arbiter pushes transfers and asks for the next chunk at a given
link time; only transfers that had arrived by then are eligible, so the schedule is the one an
ideal link would follow however late the arbiter's thread runs.

Rules (docs/paper.md §2.3):
- Each lane has a FIFO queue and a quantum of `chunk_bytes * weight / min(weights)` bytes
  (99:1 -> the latency-critical lane may send 99 chunks per KV chunk when both are backlogged).
- The round-robin pointer visits lanes in `Lane` order; on arrival at a backlogged lane its
  deficit grows by one quantum, and it sends chunks of at most `chunk_bytes` (never past the end
  of the head transfer, never past the deficit) until the deficit is spent.
- A lane found with nothing eligible at a decision loses its deficit (no credit is banked while
  idle), so an idle lane's share goes to the busy one. Every rule reads only arrivals up to the
  decision's link time, so the schedule does not depend on when the arbiter's thread runs. With 99:1 the KV quantum is one chunk: a latency-critical
  transfer that arrives behind KV waits at most the one KV chunk on the link.

Runs (`next_run`, for links at real speed): one grant may cover many consecutive chunks of the
head transfer (the rest of the lane's turn; the rest of the transfer when no other lane holds one). The caller copies it piece by piece
(`run_pieces`: exactly the chunks of the step-by-step schedule), and if another lane's transfer
arrives meanwhile it stops after the current piece and hands the rest back (`end_run`); the state
is then the step-by-step schedule's at that chunk boundary, so the arrival still waits at most one
chunk.

Ledger (check_invariants): for every lane, pushed bytes = granted bytes + queued bytes.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Generic, Iterator, NamedTuple, TypeVar

from ...core.lanes import Lane, LaneWeights

T = TypeVar("T")


class ChunkGrant(NamedTuple, Generic[T]):
    """One chunk the link sends next: bytes [offset_bytes, offset_bytes + nbytes) of `item`.
    (A named tuple, not a dataclass: one is built per chunk on the link's hot path.)"""

    lane: Lane
    item: T
    offset_bytes: int
    nbytes: int
    is_last: bool


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    nbytes: int
    arrival_s: float
    sent_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _OpenRun(Generic[T]):
    lane: Lane
    entry: _Entry[T]
    deficit_bytes: int  # the lane's deficit when the run was granted
    nbytes: int


def _deficit_after(deficit: int, quantum: int, nbytes: int) -> int:
    """A lane's deficit after sending `nbytes` in consecutive turns, starting with `deficit`."""
    turns = -(-(nbytes - deficit) // quantum) if nbytes > deficit else 0
    return deficit + turns * quantum - nbytes


class DeficitRoundRobin(Generic[T]):
    def __init__(self, weights: LaneWeights, chunk_bytes: int, lanes: tuple[Lane, ...] = (Lane.LATENCY_CRITICAL, Lane.KV)) -> None:
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        if not lanes or len(set(lanes)) != len(lanes):
            raise ValueError(f"lanes must be distinct and non-empty, got {lanes}")
        self.chunk_bytes = chunk_bytes
        self.lanes = lanes
        w_min = min(weights.weight(l) for l in lanes)
        self.quantum_bytes = {l: max(chunk_bytes, round(chunk_bytes * weights.weight(l) / w_min)) for l in lanes}
        self._queues: dict[Lane, deque[_Entry[T]]] = {l: deque() for l in lanes}
        self._deficit_bytes = {l: 0 for l in lanes}
        self._ptr = 0
        self._topped_up = False
        self._run: _OpenRun[T] | None = None
        self.pushed_bytes = {l: 0 for l in lanes}
        self.granted_bytes = {l: 0 for l in lanes}

    def push(self, lane: Lane, item: T, nbytes: int, arrival_s: float) -> None:
        """Queue a transfer; arrivals on one lane must come in time order (FIFO per lane)."""
        if lane not in self._queues:
            raise ValueError(f"lane {lane!r} is not served here (lanes: {self.lanes})")
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        q = self._queues[lane]
        if q and arrival_s < q[-1].arrival_s:
            raise ValueError("arrivals on a lane must be in time order")
        q.append(_Entry(item, nbytes, arrival_s))
        self.pushed_bytes[lane] += nbytes

    def has_pending(self) -> bool:
        return any(self._queues.values())

    def earliest_arrival_s(self) -> float | None:
        """Arrival time of the earliest queued transfer (a lane's head is its earliest)."""
        heads = [q[0].arrival_s for q in self._queues.values() if q]
        return min(heads) if heads else None

    def queued_bytes(self, lane: Lane) -> int:
        return sum(e.nbytes - e.sent_bytes for e in self._queues[lane])

    def next_chunk(self, now_s: float, merge_until_s: float | None = None,
                   bytes_per_s: float | None = None) -> ChunkGrant[T] | None:
        """The next chunk on the link at link time `now_s`, or None if nothing has arrived.

        With `merge_until_s` and `bytes_per_s` (a rate-limited link deciding everything that
        starts before `merge_until_s`), the grant instead covers all the consecutive turns of
        the head transfer that no other lane could claim: turns the step-by-step schedule would
        start before `merge_until_s` and before any other lane's head arrives. The schedule is
        the same, in one decision instead of one per chunk.
        """
        lane = self._select(now_s)
        if lane is None:
            return None
        q = self._queues[lane]
        if merge_until_s is None or bytes_per_s is None:
            n = min(self.chunk_bytes, q[0].nbytes - q[0].sent_bytes, self._deficit_bytes[lane])
            self._deficit_bytes[lane] -= n
        else:
            n = self._merged_bytes(lane, q[0], now_s, merge_until_s, bytes_per_s)
        return self._grant(lane, q, n)

    def next_run(self, now_s: float, max_bytes: int) -> ChunkGrant[T] | None:
        """Like `next_chunk(now_s)`, but the grant covers the chunks the step-by-step schedule
        would send the head transfer back to back: the rest of the lane's turn, or, if no other
        lane holds a transfer, the rest of the transfer; at most `max_bytes` (but at least one
        chunk, cut at a chunk boundary). The run stays open until `end_run`; copy it by
        `run_pieces`."""
        if self._run is not None:
            raise RuntimeError("a run is still open: end_run first")
        lane = self._select(now_s)
        if lane is None:
            return None
        q = self._queues[lane]
        head = q[0]
        left = head.nbytes - head.sent_bytes
        d = self._deficit_bytes[lane]
        n = min(self.chunk_bytes, left, d)
        # the other lanes can claim the link after this turn (deficit d) if they hold a transfer
        contested = any(oq for other, oq in self._queues.items() if other != lane)
        limit = min(left, d) if contested else left
        if n < limit:
            n = limit if limit <= max_bytes else max(n, self._boundary_at_or_before(lane, d, max_bytes))
        self._deficit_bytes[lane] = _deficit_after(d, self.quantum_bytes[lane], n)
        self._run = _OpenRun(lane, head, d, n)
        return self._grant(lane, q, n)

    def run_pieces(self) -> Iterator[int]:
        """Sizes of the open run's chunks in the step-by-step schedule, in order."""
        run = self._run
        if run is None:
            raise RuntimeError("no open run")
        chunk, quantum = self.chunk_bytes, self.quantum_bytes[run.lane]
        d, left = run.deficit_bytes, run.nbytes
        while left > 0:
            if d == 0:
                d = quantum
            k = min(chunk, d, left)
            yield k
            d -= k
            left -= k

    def end_run(self, sent_bytes: int) -> int:
        """Close the open run after its first `sent_bytes` (the end of one of its pieces); the
        rest goes back to the head of its lane. Returns the bytes handed back. The transfer must
        not have been dropped or drained meanwhile unless `sent_bytes` is the whole run."""
        run = self._run
        if run is None:
            raise RuntimeError("no open run")
        if not 0 < sent_bytes <= run.nbytes:
            raise ValueError(f"sent_bytes must be in (0, {run.nbytes}], got {sent_bytes}")
        self._run = None
        back = run.nbytes - sent_bytes
        if back:
            q = self._queues[run.lane]
            e = run.entry
            if not q or q[0] is not e:  # the run reached the transfer's end: it was popped
                q.appendleft(e)
            e.sent_bytes -= back
            self.granted_bytes[run.lane] -= back
            self._deficit_bytes[run.lane] = _deficit_after(run.deficit_bytes, self.quantum_bytes[run.lane], sent_bytes)
        return back

    @property
    def run_open(self) -> bool:
        return self._run is not None

    def drop(self, item: T) -> int:
        """Remove a queued transfer (failed or cancelled); returns its unsent bytes."""
        for lane, q in self._queues.items():
            for e in q:
                if e.item is item:
                    q.remove(e)
                    left = e.nbytes - e.sent_bytes
                    self.pushed_bytes[lane] -= left
                    return left
        return 0

    def drain(self) -> list[tuple[T, int]]:
        """Remove every queued transfer (closing); returns (item, unsent bytes) in lane, then
        FIFO, order."""
        drained = []
        for lane, q in self._queues.items():
            for e in q:
                left = e.nbytes - e.sent_bytes
                self.pushed_bytes[lane] -= left
                drained.append((e.item, left))
            q.clear()
        return drained

    def check_invariants(self) -> None:
        for lane, q in self._queues.items():
            assert self.pushed_bytes[lane] == self.granted_bytes[lane] + self.queued_bytes(lane), f"byte ledger broken on {lane!r}"
            assert all(0 <= e.sent_bytes < e.nbytes for e in q), "a finished transfer is still queued"
            assert 0 <= self._deficit_bytes[lane] <= self.quantum_bytes[lane], f"deficit out of range on {lane!r}"

    def _select(self, now_s: float) -> Lane | None:
        """Move the round-robin pointer to the lane that sends next at `now_s` (topped up, with
        a positive deficit and an eligible head); None if nothing has arrived."""
        for q in self._queues.values():
            if q and q[0].arrival_s <= now_s:
                break
        else:
            return None
        while True:
            lane = self.lanes[self._ptr]
            q = self._queues[lane]
            if not q or q[0].arrival_s > now_s:
                self._deficit_bytes[lane] = 0
                self._advance()
                continue
            if not self._topped_up:
                self._deficit_bytes[lane] += self.quantum_bytes[lane]
                self._topped_up = True
            if self._deficit_bytes[lane] <= 0:
                self._advance()
                continue
            return lane

    def _boundary_at_or_before(self, lane: Lane, deficit: int, nbytes: int) -> int:
        """The last step-by-step chunk boundary at or before `nbytes` bytes into this lane's
        turns (first turn `deficit` bytes, then quanta; chunks cut within each turn)."""
        quantum = self.quantum_bytes[lane]
        start = 0 if nbytes < deficit else deficit + (nbytes - deficit) // quantum * quantum
        return start + (nbytes - start) // self.chunk_bytes * self.chunk_bytes

    def _advance(self) -> None:
        self._ptr = (self._ptr + 1) % len(self.lanes)
        self._topped_up = False

    def _merged_bytes(self, lane: Lane, head: _Entry[T], now_s: float, until_s: float, bytes_per_s: float) -> int:
        """Bytes of the head transfer sent in this turn and the following uncontested ones;
        leaves the lane's deficit as the step-by-step schedule would."""
        left = head.nbytes - head.sent_bytes
        d = self._deficit_bytes[lane]
        quantum = self.quantum_bytes[lane]
        n = min(left, d)
        if n < left:
            others = [q[0].arrival_s for l, q in self._queues.items() if l != lane and q]
            limit_s = min([until_s, *others])
            # the i-th extra turn starts at now + (d + (i - 1) * quantum) / rate, if before limit_s
            extra = ((limit_s - now_s) * bytes_per_s - d) / quantum
            if extra > 0:
                n = min(left, d + math.ceil(extra) * quantum)
        self._deficit_bytes[lane] = _deficit_after(d, quantum, n)
        return n

    def _grant(self, lane: Lane, q: deque[_Entry[T]], n: int) -> ChunkGrant[T]:
        head = q[0]
        offset = head.sent_bytes
        head.sent_bytes += n
        self.granted_bytes[lane] += n
        last = head.sent_bytes == head.nbytes
        if last:  # a now-empty lane keeps its deficit until a decision finds it idle (link time)
            q.popleft()
        return ChunkGrant(lane, head.item, offset, n, last)
