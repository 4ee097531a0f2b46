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
                 "kv_flood", "lc_reserved_bytes_per_s", "watchers", "fifo", "_head")

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
        self._refresh_lane_shares()

    def share(self, lane: int) -> float:
        """Rate one flow of `lane` gets on this link now."""
        return self._flow_rate[lane]

    def lc_burst_rate(self) -> float:
        """Rate a latency-critical burst starting now would get: with two classes its lane's share
        (all of it when KV is idle, 99% under contention, docs/paper.md §2.3); with one FIFO class, one
        flow's share among every flow on the link (processor sharing)."""
        n_lc, n_kv = len(self.flows[0]) + 1, len(self.flows[1]) + self.kv_flood
        cap = self.capacity_bytes_per_s
        if self.weights.one_class:
            return cap / (n_lc + n_kv)
        if not n_kv:
            return cap / n_lc
        w_lc, w_kv = self.weights.latency_critical, self.weights.kv
        return cap * w_lc / (w_lc + w_kv) / n_lc

    def _refresh_lane_shares(self) -> None:
        n_lc, n_kv = len(self.flows[0]), len(self.flows[1]) + self.kv_flood
        cap = self.capacity_bytes_per_s
        w_lc, w_kv = self.weights.latency_critical, self.weights.kv
        if self.weights.one_class:
            lc = kv = cap / (n_lc + n_kv) if n_lc + n_kv else cap  # per flow
        elif n_lc and n_kv:
            lc, kv = cap * w_lc / (w_lc + w_kv) / n_lc, cap * w_kv / (w_lc + w_kv) / n_kv
        else:
            lc, kv = cap / max(1, n_lc), cap / max(1, n_kv)
        if self.lc_reserved_bytes_per_s and n_kv:
            floor = cap * w_kv / (w_lc + w_kv)  # the KV class is never starved (weighted round robin)
            kv = min(kv, max(cap - self.lc_reserved_bytes_per_s, floor) / n_kv)
        self._flow_rate[0], self._flow_rate[1] = lc, kv
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
    """Tell who watches a link (an EP group's step time, sim/ep_comm.py) that its flows changed."""
    for link in links:
        for watcher in link.watchers:
            watcher()


class Network:
    """Owns every active flow; starts, re-rates and completes them on the event loop."""

    def __init__(self, loop: EventLoop) -> None:
        self.loop = loop
        self._next_fid = 0
        self.num_active = 0
        self.completed_bytes = [0.0, 0.0]
        self.started_bytes = [0.0, 0.0]
        self.booked_bytes = [0.0, 0.0]

    def start(self, size_bytes: float, lane: Lane, links: tuple[Link, ...], on_done: Callable[[Flow], None], tag: Any = None) -> Flow:
        if not links:
            raise ValueError("a flow needs at least one link")
        if size_bytes < 0:
            raise ValueError("negative flow size")
        if len(links) == 2 and links[0] is links[1]:  # one arbiter for both directions (FIFO links)
            links = links[:1]
        if len(links) > 1 and sum(link.fifo for link in links) > 1:
            raise ValueError("a flow may cross at most one FIFO link")
        self._next_fid += 1
        flow = Flow(self._next_fid, float(size_bytes), lane, links, on_done, tag)
        flow.updated_s = flow.start_s = self.loop.now_s
        self.started_bytes[flow.lane] += flow.size_bytes
        self.num_active += 1
        for link in links:
            self._advance_link(link)
            link.flows[flow.lane][flow.fid] = flow
            link._refresh_lane_shares()
        for link in links:
            self._rerate_link(link)
        _notify(links)
        return flow

    def _advance(self, flow: Flow) -> None:
        self._advance_flows((flow,))

    def _advance_flows(self, flows: Iterable[Flow]) -> None:
        """Move each flow's bytes at its current rate up to now (the loop runs here, not per
        flow: this and `_rerate_link` are the network's hot loops)."""
        now = self.loop.now_s
        for f in flows:
            dt = now - f.updated_s
            if dt > 0.0 and f.rate > 0.0:
                moved = min(f.left_bytes, f.rate * dt)
                f.left_bytes -= moved
                for link in f.links:
                    link.served_bytes[f.lane] += moved
            f.updated_s = now

    def book(self, link: Link, lane: Lane, nbytes: float) -> None:
        """Account bytes on a link whose timing is modelled elsewhere (or not at all): they count in
        the link's ledger and utilisation but do not take a share of its capacity."""
        link.served_bytes[int(lane)] += nbytes
        self.booked_bytes[int(lane)] += nbytes

    def reserve_lc(self, link: Link, bytes_per_s: float) -> None:
        """Set the mean rate of the latency-critical bursts on `link` (its KV flows are re-rated)."""
        if bytes_per_s == link.lc_reserved_bytes_per_s:
            return
        if not link.flows[1]:  # no KV flow to re-rate: `start` refreshes the shares when one comes
            link.lc_reserved_bytes_per_s = bytes_per_s
            return
        self._advance_link(link)
        link.lc_reserved_bytes_per_s = bytes_per_s
        link._refresh_lane_shares()
        self._rerate_link(link)

    def settle(self, link: Link) -> None:
        """Bring `served_bytes` of `link` up to now (for sampling)."""
        self._advance_link(link)

    def _advance_link(self, link: Link) -> None:
        for lane_flows in link.flows:
            if lane_flows:  # most links carry one lane at a time: no call for the idle one
                self._advance_flows(lane_flows.values())

    def _rerate_link(self, link: Link) -> None:
        """Re-derive the rate of every flow of the link: the smallest `Link.share` over the flow's
        links (inlined). Callers advance the link's flows first (every mutation path does).

        Completion events are rescheduled lazily: a faster rate moves the event earlier (a new
        event, the old one goes stale by version); a slower one keeps the pending, now early, event,
        which on firing finds bytes left and re-arms itself. This halves the heap traffic, since
        every flow start slows its neighbours down and every finish speeds them up."""
        loop = self.loop
        now = loop.now_s
        for lane, lane_flows in enumerate(link.flows):
            for f in lane_flows.values():  # only events are scheduled here; the dict is not mutated
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
                    loop.call_at(eta, self._finish, (f, f.version))

    def _finish(self, arg: tuple[Flow, int]) -> None:
        flow, version = arg
        if version != flow.version:
            return
        self._advance(flow)
        if flow.left_bytes > _DONE_FRACTION * flow.size_bytes + _EPS_BYTES:
            eta = self.loop.now_s + flow.left_bytes / flow.rate
            if eta > self.loop.now_s:  # else the rest is below the clock's resolution: done
                # the flow slowed down after this event was armed: re-arm at the true finish
                flow.eta_s = eta
                self.loop.call_at(eta, self._finish, (flow, flow.version))
                return
        # Floating error: whatever is left (a few bytes at most) is moved now.
        if flow.left_bytes > 0.0:
            for link in flow.links:
                link.served_bytes[flow.lane] += flow.left_bytes
            flow.left_bytes = 0.0
        flow.version += 1
        self.num_active -= 1
        self.completed_bytes[flow.lane] += flow.size_bytes
        for link in flow.links:
            self._advance_link(link)
            del link.flows[flow.lane][flow.fid]
            link._refresh_lane_shares()
        for link in flow.links:
            self._rerate_link(link)
        _notify(flow.links)
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
