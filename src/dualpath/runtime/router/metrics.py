"""The router's metrics: per-request timestamps and bytes, summarised with the simulator's names
(`ttft_s`, `ttst_s`, `tpot_s`, `bytes.storage_to_prefill`, ...) and exposed as Prometheus families."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...metrics import turn_latencies
from ...metrics.decisions import DecisionLog
from ...metrics.timeline import NULL_TIMELINE, ROUTER, SIDES, Timeline
from ...metrics.prometheus import Family, Sample, family, summary_samples
from ..protocol import INTEGRITY_COUNTERS, Counters

@dataclass(frozen=True, slots=True)
class QueueGauges:
    """What the router's queues hold at scrape time (the router fills it; metrics never reads it)."""

    prefill_requests: int  # global PE queue
    decode_requests: int  # global DE queue + the groups' private queues
    placing_requests: int  # PE and DE chosen, waiting for buffer room (or a persist)
    read_queue_tokens: tuple[tuple[int, str, int], ...]  # (engine, role, tokens) per node
    snic_bytes_per_s: float | None


@dataclass(slots=True)
class _Req:
    arrival_s: float
    token_s: list = field(default_factory=list)
    hit_tokens: int = 0
    side: int = 0
    finished: bool = False


class RouterMetrics:
    def __init__(self, clock: Any, store: Callable[[], Any] = lambda: None) -> None:
        self.clock = clock
        self._store = store  # the router's store now: a service client counts the calls its breaker skipped
        self.persist_failures = 0  # DE writes that ended without the block stored (Persisted.stored False)
        self.persisted_blocks = 0  # DE writes that stored their block
        self.reqs: dict[int, _Req] = {}
        self.bytes_by_side = [0, 0]  # storage reads landing on the PE / DE side
        self.hit_tokens_by_side = [0, 0]  # cached tokens placed to load through the PE / DE side
        self.engine_counters: dict[int, Counters] = {}
        self.num_cancelled = 0
        self.num_migrated = 0  # attempts moved to another engine after theirs died (recovery.py)
        self.num_failed = 0  # streams ended by an error (an engine died, none could continue)
        self.num_recomputed_hits = 0  # hits the scheduler chose to compute again (a slow store)
        self.started_s = clock.now_s()
        # metrics/decisions.py; None (the default): not recorded. engine id -> index within its role
        self.decisions: DecisionLog | None = None
        self.engine_index: dict[int, int] = {}
        # the run's spans (metrics/timeline.py): the router's instants and the engines' spans from
        # their Counters; NULL_TIMELINE (the default): not recorded
        self.timeline: Timeline = NULL_TIMELINE

    def arrived(self, rid: int) -> None:
        self.reqs[rid] = _Req(self.clock.now_s())

    def pe_assigned(self, rid: int) -> None:
        pass

    def de_assigned(self, rr: Any, side: int, read_tokens: int, recompute: bool = False, pe_part_tokens: int = 0,
                    costs: tuple[int, int] = (-1, -1)) -> None:
        """A pass chose the DE and read side of `rr` (a RouterRequest): the decision log's line (a
        split read's PE part in `pe_part_tokens`; what the read-side rule compared in `costs`)."""
        self.num_recomputed_hits += recompute
        self.timeline.name(rr.rid, rr.req.request_id)  # the engines' spans name requests by rid
        if self.decisions is not None:
            pe = -1 if rr.pe is None else self.engine_index[rr.pe.engine]  # -1: prefilled on its DE (+selective)
            self.decisions.record(rr.req.request_id, self.clock.now_s(), pe,
                                  self.engine_index[rr.de.engine], side, read_tokens, pe_part_tokens, *costs)

    def placed(self, rid: int, hit_tokens: int, side: int) -> None:
        r = self.reqs[rid]
        r.hit_tokens, r.side = hit_tokens, int(side)
        self.hit_tokens_by_side[int(side)] += hit_tokens
        self.timeline.mark(ROUTER, "placed", rid, {"hit_tokens": hit_tokens, "side": SIDES[side]})

    def persisted(self, stored: bool) -> None:
        """A DE's block write ended (protocol.py: Persisted), stored or not."""
        self.persisted_blocks += stored
        self.persist_failures += not stored

    def read_done(self, rid: int, on_prefill_side: bool, nbytes: int) -> None:
        self.bytes_by_side[0 if on_prefill_side else 1] += nbytes

    def token(self, rid: int, index: int, now_s: float) -> None:
        self.reqs[rid].token_s.append(now_s)
        if index == 0:
            self.timeline.instant(ROUTER, "first_token", now_s, rid)

    def finished(self, rid: int) -> None:
        self.reqs[rid].finished = True

    def cancelled(self, rid: int) -> None:
        self.num_cancelled += 1

    def migrated(self, rid: int) -> None:
        self.num_migrated += 1

    def failed(self, rid: int) -> None:
        self.num_failed += 1

    def store_latency_s(self, engine: int) -> float:
        """The store latency `engine`'s reader last reported (Counters.read_latency_s); 0: none yet."""
        c = self.engine_counters.get(engine)
        return c.read_latency_s if c is not None else 0.0

    def counters(self, c: Counters) -> None:
        self.engine_counters[c.engine] = c
        self.timeline.add(c.spans)

    # --- summaries ---------------------------------------------------------------------------------
    def store_faults(self) -> dict[str, int]:
        """What a dead or frozen storage service cost: persists that failed, and calls answered
        without it while a client's breaker was open (store/breaker.py), the router's by op."""
        mine = getattr(self._store(), "skipped_calls", dict)()  # {} for a local BlockStore
        return {"persist_failures": self.persist_failures, "router_skipped_lookups": int(mine.get("lookup", 0)),
                "router_skipped_calls": int(sum(mine.values())),
                "engine_skipped_calls": int(sum(c.store_skipped_calls for c in self.engine_counters.values()))}

    def integrity(self) -> dict[str, int]:
        """Transfer-integrity counters summed over the engines (transport/integrity.py)."""
        c = list(self.engine_counters.values())
        return {k: int(sum(getattr(x, k) for x in c)) for k in INTEGRITY_COUNTERS}

    def summary(self) -> dict[str, Any]:
        done = [r for r in self.reqs.values() if r.finished and r.token_s]
        c = list(self.engine_counters.values())
        return {
            **turn_latencies([r.arrival_s for r in done], [r.token_s[0] for r in done],
                             [r.token_s[min(1, len(r.token_s) - 1)] for r in done], [r.token_s[-1] for r in done],
                             [len(r.token_s) for r in done]),
            "bytes": {
                "storage_to_prefill": float(self.bytes_by_side[0]),
                "storage_via_decode": float(self.bytes_by_side[1]),
                "persisted": float(sum(x.storage_write_bytes for x in c)),
                "cnic_lane_kv": float(sum(x.cnic_kv_bytes for x in c)),
                "cnic_lane_latency_critical": float(sum(x.cnic_lc_bytes for x in c)),
                "remote_writes": float(sum(x.remote_write_bytes for x in c)),
            },
            "integrity": self.integrity(),
            "recomputed_hits": self.num_recomputed_hits,
            "store": self.store_faults(),
            "num_turns": len(done),
            "cached_tokens": int(sum(r.hit_tokens for r in done)),
        }

    def families(self, q: QueueGauges) -> list[Family]:
        """The router's metrics as Prometheus families (metrics/prometheus.py writes them)."""
        s = self.summary()
        elapsed = max(1e-9, self.clock.now_s() - self.started_s)
        rate = q.snic_bytes_per_s
        out = [
            family("dualpath_requests_total", "counter", "Requests received.", [Sample(len(self.reqs))]),
            family("dualpath_requests_cancelled_total", "counter", "Requests whose client went away.",
                   [Sample(self.num_cancelled)]),
            family("dualpath_requests_migrated_total", "counter", "Request attempts moved off an engine that died.",
                   [Sample(self.num_migrated)]),
            family("dualpath_requests_failed_total", "counter", "Requests ended by an engine fault (HTTP 503 / SSE error).",
                   [Sample(self.num_failed)]),
            family("dualpath_kv_load_bytes_total", "counter", "KV bytes loaded from storage, by read path.",
                   [Sample(self.bytes_by_side[0], {"path": "prefill"}), Sample(self.bytes_by_side[1], {"path": "decode"})]),
            family("dualpath_kv_load_tokens_total", "counter", "Cached prompt tokens placed to load, by read path.",
                   [Sample(self.hit_tokens_by_side[0], {"path": "prefill"}),
                    Sample(self.hit_tokens_by_side[1], {"path": "decode"})]),
            family("dualpath_cnic_bytes_total", "counter", "Bytes through engines' CNIC arbiters, by lane.",
                   [Sample(s["bytes"]["cnic_lane_kv"], {"lane": "kv"}),
                    Sample(s["bytes"]["cnic_lane_latency_critical"], {"lane": "latency_critical"})]),
            family("dualpath_queue_requests", "gauge", "Requests waiting, by queue.",
                   [Sample(q.prefill_requests, {"queue": "prefill"}), Sample(q.decode_requests, {"queue": "decode"}),
                    Sample(q.placing_requests, {"queue": "placing"})]),
            family("dualpath_read_queue_tokens", "gauge", "Disk-read queue of a node, in tokens.",
                   [Sample(tokens, {"engine": str(e), "role": role}) for e, role, tokens in q.read_queue_tokens]),
            family("dualpath_snic_utilisation", "gauge", "Storage bytes read / (SNIC rate x time) per node.",
                   [Sample(c.storage_read_bytes / (rate * elapsed) if rate else float("nan"), {"engine": str(e)})
                    for e, c in sorted(self.engine_counters.items())]),
        ]
        out += self._integrity_families() + self._store_families()
        for name in ("ttft_s", "tpot_s"):
            d = s[name]
            quantiles = {f"0.{k[1:]}": d[k] for k in ("p50", "p90", "p99")}
            out.append(family(f"dualpath_{name}", "summary", f"{name.upper()[:-2]} in seconds.",
                              summary_samples(quantiles, d["count"])))
        return out

    def _store_families(self) -> list[Family]:
        f = self.store_faults()
        return [
            family("dualpath_store_persisted_blocks_total", "counter", "Blocks the decode engines stored.",
                   [Sample(self.persisted_blocks)]),
            family("dualpath_store_persist_failures_total", "counter", "Block persists that ended without the block stored.",
                   [Sample(f["persist_failures"])]),
            family("dualpath_store_calls_skipped_total", "counter",
                   "Storage-service calls answered without the service while its client's circuit breaker was open.",
                   [Sample(f["router_skipped_calls"], {"client": "router"}),
                    Sample(f["engine_skipped_calls"], {"client": "engines"})]),
        ]

    def _integrity_families(self) -> list[Family]:
        i = self.integrity()
        return [
            family("dualpath_kv_checksum_failures_total", "counter",
                   "KV block pieces whose bytes failed the sender's checksum at the receiver, by path.",
                   [Sample(i["layer_checksum_failures"], {"path": "layer_stream"}),
                    Sample(i["pd_checksum_failures"], {"path": "pd_transfer"})]),
            family("dualpath_kv_retransmits_total", "counter", "Layer loads asked again after a checksum mismatch.",
                   [Sample(i["layer_retransmits"])]),
            family("dualpath_kv_recomputes_total", "counter",
                   "Requests whose KV was recomputed because its transfer failed every check.",
                   [Sample(i["kv_recomputes"])]),
        ]
