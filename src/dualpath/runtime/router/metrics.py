"""The router's metrics: per-request timestamps and bytes, summarised with the simulator's names
(`ttft_s`, `ttst_s`, `tpot_s`, `bytes.storage_to_prefill`, ...) and exposed as Prometheus text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...metrics import distribution
from ..protocol import Counters



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
    def __init__(self, clock: Any) -> None:
        self.clock = clock
        self.reqs: dict[int, _Req] = {}
        self.bytes_by_side = [0, 0]  # storage reads landing on the PE / DE side
        self.engine_counters: dict[int, Counters] = {}
        self.num_cancelled = 0
        self.started_s = clock.now_s()

    def arrived(self, rid: int) -> None:
        self.reqs[rid] = _Req(self.clock.now_s())

    def pe_assigned(self, rid: int) -> None:
        pass

    def de_assigned(self, rid: int) -> None:
        pass

    def placed(self, rid: int, hit_tokens: int, side: int) -> None:
        r = self.reqs[rid]
        r.hit_tokens, r.side = hit_tokens, int(side)

    def read_done(self, rid: int, on_prefill_side: bool, nbytes: int) -> None:
        self.bytes_by_side[0 if on_prefill_side else 1] += nbytes

    def token(self, rid: int, index: int, now_s: float) -> None:
        self.reqs[rid].token_s.append(now_s)

    def finished(self, rid: int) -> None:
        self.reqs[rid].finished = True

    def cancelled(self, rid: int) -> None:
        self.num_cancelled += 1

    def counters(self, c: Counters) -> None:
        self.engine_counters[c.engine] = c

    # --- summaries ---------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        done = [r for r in self.reqs.values() if r.finished and r.token_s]
        ttft = [r.token_s[0] - r.arrival_s for r in done]
        ttst = [r.token_s[1] - r.token_s[0] for r in done if len(r.token_s) >= 2]
        tpot = [(r.token_s[-1] - r.token_s[1]) / (len(r.token_s) - 2) for r in done if len(r.token_s) >= 3]
        c = list(self.engine_counters.values())
        return {
            "ttft_s": distribution(ttft).to_dict(),
            "ttst_s": distribution(ttst).to_dict(),
            "tpot_s": distribution(tpot).to_dict(),
            "bytes": {
                "storage_to_prefill": float(self.bytes_by_side[0]),
                "storage_via_decode": float(self.bytes_by_side[1]),
                "persisted": float(sum(x.storage_write_bytes for x in c)),
                "cnic_lane_kv": float(sum(x.cnic_kv_bytes for x in c)),
                "cnic_lane_latency_critical": float(sum(x.cnic_lc_bytes for x in c)),
            },
            "num_turns": len(done),
            "cached_tokens": int(sum(r.hit_tokens for r in done)),
        }

    def prometheus(self, q: QueueGauges) -> str:
        s = self.summary()
        lines = [
            "# HELP dualpath_requests_total Requests received.", "# TYPE dualpath_requests_total counter",
            f"dualpath_requests_total {len(self.reqs)}",
            "# HELP dualpath_requests_cancelled_total Requests whose client went away.",
            "# TYPE dualpath_requests_cancelled_total counter", f"dualpath_requests_cancelled_total {self.num_cancelled}",
            "# HELP dualpath_storage_read_bytes_total KV bytes read from storage, by read path.",
            "# TYPE dualpath_storage_read_bytes_total counter",
            f'dualpath_storage_read_bytes_total{{path="prefill"}} {self.bytes_by_side[0]}',
            f'dualpath_storage_read_bytes_total{{path="decode"}} {self.bytes_by_side[1]}',
            "# HELP dualpath_cnic_bytes_total Bytes through engines' CNIC arbiters, by lane.",
            "# TYPE dualpath_cnic_bytes_total counter",
            f'dualpath_cnic_bytes_total{{lane="kv"}} {s["bytes"]["cnic_lane_kv"]:.0f}',
            f'dualpath_cnic_bytes_total{{lane="latency_critical"}} {s["bytes"]["cnic_lane_latency_critical"]:.0f}',
            "# HELP dualpath_queue_requests Requests waiting, by queue.", "# TYPE dualpath_queue_requests gauge",
            f'dualpath_queue_requests{{queue="prefill"}} {q.prefill_requests}',
            f'dualpath_queue_requests{{queue="decode"}} {q.decode_requests}',
            f'dualpath_queue_requests{{queue="placing"}} {q.placing_requests}',
            "# HELP dualpath_read_queue_tokens Disk-read queue of a node, in tokens.", "# TYPE dualpath_read_queue_tokens gauge",
        ]
        lines += [f'dualpath_read_queue_tokens{{engine="{e}",role="{role}"}} {tokens}' for e, role, tokens in q.read_queue_tokens]
        elapsed = max(1e-9, self.clock.now_s() - self.started_s)
        rate = q.snic_bytes_per_s
        lines += ["# HELP dualpath_snic_utilisation Storage bytes read / (SNIC rate x time) per node.",
                  "# TYPE dualpath_snic_utilisation gauge"]
        for e, c in sorted(self.engine_counters.items()):
            util = c.storage_read_bytes / (rate * elapsed) if rate else float("nan")
            lines.append(f'dualpath_snic_utilisation{{engine="{e}"}} {util:.6f}')
        for name in ("ttft_s", "tpot_s"):
            d = s[name]
            lines += [f"# HELP dualpath_{name} {name.upper()[:-2]} in seconds.", f"# TYPE dualpath_{name} summary"]
            for q in ("p50", "p90", "p99"):
                v = d[q]
                lines.append(f'dualpath_{name}{{quantile="0.{q[1:]}"}} {v if v == v else "NaN"}')
            lines.append(f"dualpath_{name}_count {d['count']}")
        return "\n".join(lines) + "\n"

