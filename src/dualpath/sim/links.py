"""Links with lanes and the flows that cross them.

Sharing model (weighted processor sharing, local fair share):
- a link's capacity is split between its busy lanes in proportion to the lane weights (an idle
  lane's share goes to the busy ones), then equally between the flows of a lane;
- a flow crossing several links runs at the smallest share it gets on any of them.

A FIFO link (`fifo=True`, the `local` preset's model of the runtime's LinkArbiter,
runtime/transport/arbiter.py) serves each lane's flows one at a time in the order they started:
the lane's head gets the lane's whole share, the flows behind it wait at rate 0 (with one class,
one queue for both lanes). A flow may cross at most one FIFO link, so a head never waits on another.

With one FIFO class (`LaneWeights.one_class`, the ablation of `dualpath bench lanes --sim`) every flow of the link
gets an equal share whatever its lane. A link may carry a saturating KV flood (`kv_flood`), and
latency-critical bursts whose timing is modelled by their sender (sim/ep_comm.py) reserve their mean
rate, which the KV lane cannot use (`lc_reserved_bytes_per_s`).

The second rule does not hand bandwidth a flow cannot use on one link to the others (it is not
max-min fair across links); on a single link it is exact processor sharing. It keeps every rate
update local: when the flows of one link change, only that link's flows are re-rated, because a
flow's share on its other links does not depend on this link.

Ledger: `served_bytes[lane]` of every link equals the bytes its flows have moved; each finished
flow moved exactly its size. `check_invariants` verifies both.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ..core.lanes import Lane, LaneWeights
from .events import EventLoop

_EPS_BYTES = 1e-6
_DONE_FRACTION = 1e-9  # a flow within this fraction of its size is done (float error of rate * dt)
_INF = float("inf")


class Link:
    __slots__ = ("name", "capacity_bytes_per_s", "weights", "flows", "served_bytes", "_flow_rate",
                 "kv_flood", "lc_reserved_bytes_per_s", "watchers", "fifo", "_head", "_one_class", "_lc_part", "_kv_part",
                 "_n_flood")

    def __init__(self, name: str, capacity_bytes_per_s: float, weights: LaneWeights, kv_flood: bool = False,
                 fifo: bool = False) -> None:
        if capacity_bytes_per_s <= 0:
            raise ValueError(f"link {name}: capacity must be positive")
        if fifo and kv_flood:
            raise ValueError(f"link {name}: a KV flood never ends, so a FIFO link would serve nothing behind it")
        self.fifo = fifo
        self._head: list[int | None] = [None, None]  # FIFO: the fid each lane serves now
        self.name = name
        self.capacity_bytes_per_s = capacity_bytes_per_s
        self.weights = weights
        self.flows: tuple[dict[int, "Flow"], dict[int, "Flow"]] = ({}, {})  # by Lane value
        self.served_bytes = [0.0, 0.0]
        self._flow_rate = [capacity_bytes_per_s, capacity_bytes_per_s]  # what one flow of a lane gets now
        # ablation (`dualpath bench lanes --sim`): a backlogged KV flow that never ends, the KV class saturated; it
        # takes its share like any KV flow, its bytes are not counted
        self.kv_flood = kv_flood
        # the mean rate of latency-critical bursts booked on this link (sim/ep_comm.py): the KV
        # lane cannot use it, since every burst byte crosses the link too
        self.lc_reserved_bytes_per_s = 0.0
        self.watchers: list[Callable[[], None]] = []  # called after its set of flows changed
        # constants of the share rule, derived once (the same operations, in the same order, as
        # written out in `lc_burst_rate` and `_refresh_lane_shares`' docstring)
        w_lc, w_kv = weights.latency_critical, weights.kv
        self._one_class = weights.one_class
        self._lc_part = capacity_bytes_per_s * w_lc / (w_lc + w_kv)  # the LC lane's share under contention
        self._kv_part = capacity_bytes_per_s * w_kv / (w_lc + w_kv)  # the KV lane's (and its floor)
        self._n_flood = 1 if kv_flood else 0
        self._refresh_lane_shares()

    def share(self, lane: int) -> float:
        """Rate one flow of `lane` gets on this link now."""
        return self._flow_rate[lane]

    def lc_burst_rate(self) -> float:
        """Rate a latency-critical burst starting now would get: with two classes its lane's share
        (all of it when KV is idle, 99% under contention, docs/paper.md §2.3); with one FIFO class, one
        flow's share among every flow on the link (processor sharing): with n_lc = LC flows + 1
        (the burst) and n_kv = KV flows (+ 1 for a flood), cap / (n_lc + n_kv) with one class,
        cap / n_lc when KV is idle, else cap * w_lc / (w_lc + w_kv) / n_lc."""
        flows = self.flows
        n_lc = len(flows[0]) + 1
        n_kv = len(flows[1]) + self._n_flood
        if self._one_class:
            return self.capacity_bytes_per_s / (n_lc + n_kv)
        if not n_kv:
            return self.capacity_bytes_per_s / n_lc
        return self._lc_part / n_lc

    def _refresh_lane_shares(self) -> None:
        """What one flow of each lane gets now, with cap the capacity, (w_lc, w_kv) the lane weights
        and n_lc, n_kv the lanes' flows (a flood counts as one KV flow): with one class
        cap / (n_lc + n_kv) each (cap when idle); with both lanes busy cap * w_lc / (w_lc + w_kv) / n_lc
        and cap * w_kv / (w_lc + w_kv) / n_kv; else cap / n of the busy lane. With LC bursts
        reserved (sim/ep_comm.py) a KV flow gets at most max(cap - reserved, cap * w_kv / (w_lc + w_kv)) / n_kv:
        the KV class is never starved (weighted round robin)."""
        flows = self.flows
        n_lc = len(flows[0])
        n_kv = len(flows[1]) + self._n_flood
        cap = self.capacity_bytes_per_s
        if self._one_class:
            lc = kv = cap / (n_lc + n_kv) if n_lc + n_kv else cap  # per flow
        elif n_lc and n_kv:
            lc = self._lc_part / n_lc
            kv = self._kv_part / n_kv
        else:
            lc = cap / n_lc if n_lc else cap
            kv = cap / n_kv if n_kv else cap
        reserved = self.lc_reserved_bytes_per_s
        if reserved and n_kv:
            left = cap - reserved
            floor = self._kv_part
            if floor > left:
                left = floor
            left = left / n_kv
            if left < kv:
                kv = left
        rates = self._flow_rate
        rates[0] = lc
        rates[1] = kv
        if self.fifo:
            self._refresh_heads(n_lc, n_kv)

    def _refresh_heads(self, n_lc: int, n_kv: int) -> None:
        """FIFO: each lane's head takes what its lane's flows would share; one class, one queue."""
        heads = [next(iter(lane_flows), None) for lane_flows in self.flows]
        if self.weights.one_class:
            first = min((h for h in heads if h is not None), default=None)
            heads = [h if h == first else None for h in heads]
            self._flow_rate[0] = self._flow_rate[1] = self.capacity_bytes_per_s
        else:
            self._flow_rate[0] *= max(1, n_lc)
            self._flow_rate[1] *= max(1, n_kv)
        self._head = heads

    @property
    def num_flows(self) -> int:
        return len(self.flows[0]) + len(self.flows[1])


class Flow:
    __slots__ = ("fid", "size_bytes", "left_bytes", "lane", "links", "rate", "updated_s", "version", "eta_s", "on_done", "tag",
                 "start_s")

    def __init__(self, fid: int, size_bytes: float, lane: Lane, links: tuple[Link, ...], on_done: Callable[["Flow"], None], tag: Any) -> None:
        self.fid = fid
        self.size_bytes = size_bytes
        self.left_bytes = size_bytes
        self.lane = int(lane)
        self.links = links
        self.rate = 0.0
        self.updated_s = 0.0
        self.start_s = 0.0  # when it started (the timeline's spans, metrics/timeline.py)
        self.version = 0
        self.eta_s = float("inf")  # time of the pending completion event (may be early, never late)
        self.on_done = on_done
        self.tag = tag


def _notify(links: tuple[Link, ...]) -> None:
    """Tell who watches a link (an EP group's step time, sim/ep_comm.py) that its flows changed. A
    watcher of the first link that also watches a later one (a GPU's watcher on both CNIC
    directions) is told once: watchers re-derive what they keep from the links' flows, which no
    watcher changes, so a second call would find nothing changed and do nothing."""
    first = links[0].watchers
    for watcher in first:
        watcher()
    for link in links[1:]:
        for watcher in link.watchers:
            if watcher not in first:
                watcher()


def _advance_link(link: Link, now: float) -> None:
    """Move the bytes of every flow of `link` at its current rate up to `now` (the network's hot
    loop, with `Network._rerate_link`)."""
    for lane_flows in link.flows:
        if lane_flows:  # most links carry one lane at a time: no loop for the idle one
            for f in lane_flows.values():  # `_advance_flow`, inlined
                dt = now - f.updated_s
                if dt > 0.0:
                    rate = f.rate
                    if rate > 0.0:
                        moved = rate * dt
                        left = f.left_bytes
                        if not moved < left:  # min(left, moved)
                            moved = left
                        f.left_bytes = left - moved
                        lane = f.lane
                        for other in f.links:
                            other.served_bytes[lane] += moved
                f.updated_s = now


def _advance_flow(f: Flow, now: float) -> None:
    dt = now - f.updated_s
    if dt > 0.0:
        rate = f.rate
        if rate > 0.0:
            moved = rate * dt
            left = f.left_bytes
            if not moved < left:  # min(left, moved)
                moved = left
            f.left_bytes = left - moved
            lane = f.lane
            for link in f.links:
                link.served_bytes[lane] += moved
    f.updated_s = now


class Network:
    """Owns every active flow; starts, re-rates and completes them on the event loop."""

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self._next_fid = 0
        self.num_active = 0
        self.completed_bytes = [0.0, 0.0]
        self.started_bytes = [0.0, 0.0]
        self.booked_bytes = [0.0, 0.0]
        self._on_finish: Callable[[tuple[Flow, int]], None] = self._finish  # bound once: one object per run

    def start(self, size_bytes: float, lane: Lane, links: tuple[Link, ...], on_done: Callable[[Flow], None], tag: Any = None) -> Flow:
        if not links:
            raise ValueError("a flow needs at least one link")
        if size_bytes < 0:
            raise ValueError("negative flow size")
        if len(links) > 1:
            if len(links) == 2 and links[0] is links[1]:  # one arbiter for both directions (FIFO links)
                links = links[:1]
            else:
                n_fifo = 0
                for link in links:
                    if link.fifo:
                        n_fifo += 1
                if n_fifo > 1:
                    raise ValueError("a flow may cross at most one FIFO link")
        fid = self._next_fid + 1
        self._next_fid = fid
        flow = Flow(fid, float(size_bytes), lane, links, on_done, tag)
        now = self.loop.now_s
        flow.updated_s = flow.start_s = now
        lane_i = flow.lane
        self.started_bytes[lane_i] += flow.size_bytes
        self.num_active += 1
        for link in links:
            _advance_link(link, now)
            link.flows[lane_i][fid] = flow
            link._refresh_lane_shares()
        for link in links:
            self._rerate_link(link)
        if len(links) == 1:
            for watcher in links[0].watchers:
                watcher()
        else:
            _notify(links)
        return flow

    def _advance(self, flow: Flow) -> None:
        _advance_flow(flow, self.loop.now_s)

    def _advance_flows(self, flows: Iterable[Flow]) -> None:
        """Move each flow's bytes at its current rate up to now."""
        now = self.loop.now_s
        for f in flows:
            _advance_flow(f, now)

    def book(self, link: Link, lane: Lane, nbytes: float) -> None:
        """Account bytes on a link whose timing is modelled elsewhere (or not at all): they count in
        the link's ledger and utilisation but do not take a share of its capacity."""
        i = int(lane)
        link.served_bytes[i] += nbytes
        self.booked_bytes[i] += nbytes

    def reserve_lc(self, link: Link, bytes_per_s: float) -> None:
        """Set the mean rate of the latency-critical bursts on `link` (its KV flows are re-rated)."""
        if bytes_per_s == link.lc_reserved_bytes_per_s:
            return
        if not link.flows[1]:  # no KV flow to re-rate: `start` refreshes the shares when one comes
            link.lc_reserved_bytes_per_s = bytes_per_s
            return
        _advance_link(link, self.loop.now_s)
        link.lc_reserved_bytes_per_s = bytes_per_s
        link._refresh_lane_shares()
        self._rerate_link(link)

    def settle(self, link: Link) -> None:
        """Bring `served_bytes` of `link` up to now (for sampling)."""
        _advance_link(link, self.loop.now_s)

    def _advance_link(self, link: Link) -> None:
        _advance_link(link, self.loop.now_s)

    def _rerate_link(self, link: Link) -> None:
        """Re-derive the rate of every flow of the link: the smallest `Link.share` over the flow's
        links (inlined). Callers advance the link's flows first (every mutation path does).

        Completion events are rescheduled lazily: a faster rate moves the event earlier (a new
        event, the old one goes stale by version); a slower one keeps the pending, now early, event,
        which on firing finds bytes left and re-arms itself. This halves the heap traffic, since
        every flow start slows its neighbours down and every finish speeds them up."""
        loop = self.loop
        now = loop.now_s
        on_finish = self._on_finish
        alone = not link.fifo  # a flow on this link alone gets its share here
        lane = 0
        for lane_flows in link.flows:
            if lane_flows:
                share = link._flow_rate[lane]
                for f in lane_flows.values():  # only events are scheduled here; the dict is not mutated
                    if alone and len(f.links) == 1:
                        rate = share
                    else:
                        rate = _INF
                        for other in f.links:
                            r = 0.0 if other.fifo and other._head[lane] != f.fid else other._flow_rate[lane]
                            if r < rate:
                                rate = r
                    if rate == f.rate:
                        continue
                    f.rate = rate
                    if rate == 0.0:  # queued behind a FIFO head: no event until it is served
                        f.version += 1
                        f.eta_s = _INF
                        continue
                    eta = now + f.left_bytes / rate
                    if eta < f.eta_s:
                        f.version += 1
                        f.eta_s = eta
                        loop.call_at(eta, on_finish, (f, f.version))
            lane += 1

    def _finish(self, arg: tuple[Flow, int]) -> None:
        flow, version = arg
        if version != flow.version:
            return
        now = self.loop.now_s
        _advance_flow(flow, now)
        left = flow.left_bytes
        if left > _DONE_FRACTION * flow.size_bytes + _EPS_BYTES:
            eta = now + left / flow.rate
            if eta > now:  # else the rest is below the clock's resolution: done
                # the flow slowed down after this event was armed: re-arm at the true finish
                flow.eta_s = eta
                self.loop.call_at(eta, self._on_finish, (flow, flow.version))
                return
        lane = flow.lane
        links = flow.links
        # Floating error: whatever is left (a few bytes at most) is moved now.
        if left > 0.0:
            for link in links:
                link.served_bytes[lane] += left
            flow.left_bytes = 0.0
        flow.version += 1
        self.num_active -= 1
        self.completed_bytes[lane] += flow.size_bytes
        fid = flow.fid
        for link in links:
            _advance_link(link, now)
            del link.flows[lane][fid]
            link._refresh_lane_shares()
        for link in links:
            self._rerate_link(link)
        if len(links) == 1:
            for watcher in links[0].watchers:
                watcher()
        else:
            _notify(links)
        flow.on_done(flow)

    def check_invariants(self, links: list[Link]) -> None:
        active_left = [0.0, 0.0]
        seen: set[int] = set()
        for link in links:
            for lane_flows in link.flows:
                for f in lane_flows.values():
                    if f.fid not in seen:
                        seen.add(f.fid)
                        active_left[f.lane] += f.left_bytes
                    if f.left_bytes < -_EPS_BYTES or f.left_bytes > f.size_bytes + _EPS_BYTES:
                        raise AssertionError(f"flow {f.fid} has {f.left_bytes} of {f.size_bytes} bytes left")
        if len(seen) != self.num_active:
            raise AssertionError(f"{len(seen)} flows on links, {self.num_active} active")
        for lane in (0, 1):
            in_flight = self.started_bytes[lane] - self.completed_bytes[lane]
            tol = 1e-6 * max(1.0, self.started_bytes[lane])
            # every started byte is either finished or accounted as in flight
            assert in_flight >= -tol, f"lane {lane}: more completed than started"
            assert active_left[lane] <= in_flight + tol, f"lane {lane}: flows hold more bytes than in flight"
