"""The one Prometheus writer: metric families in, text exposition (version 0.0.4) out, through
`prometheus_client` (as vLLM and SGLang expose theirs).

The router, the engines' counters and the HTTP server each describe their families with
`family(...)`; `render` writes any number of them in one exposition. The values are read from the
owners' own ledgers at scrape time (a custom collector), not kept twice in client-side metric
objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.metrics_core import Metric

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

MetricKind = Literal["counter", "gauge", "summary", "untyped"]


@dataclass(frozen=True, slots=True)
class Sample:
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)
    suffix: str = ""  # a summary's "_count" / "_sum"; "" for the family's own samples


@dataclass(frozen=True, slots=True)
class Family:
    name: str  # a counter's name ends in _total
    kind: MetricKind
    help_text: str
    samples: tuple[Sample, ...]


def family(name: str, kind: MetricKind, help_text: str, samples: Iterable[Sample]) -> Family:
    if kind == "counter" and not name.endswith("_total"):
        raise ValueError(f"counter {name!r} must end in _total")
    return Family(name, kind, help_text, tuple(samples))


def summary_samples(quantiles: Mapping[str, float], count: int, labels: Mapping[str, str] | None = None) -> list[Sample]:
    """A summary's samples: one per quantile ("0.5" -> value) and its count."""
    base = dict(labels or {})
    out = [Sample(v, {**base, "quantile": q}) for q, v in quantiles.items()]
    out.append(Sample(count, base, "_count"))
    return out


class _Families:
    """A collector over fixed families (prometheus_client's custom-collector protocol)."""

    def __init__(self, families: Iterable[Family]) -> None:
        self._families = list(families)

    def collect(self) -> Iterable[Metric]:
        for f in self._families:
            base = f.name.removesuffix("_total") if f.kind == "counter" else f.name
            metric = Metric(base, f.help_text, "unknown" if f.kind == "untyped" else f.kind)
            for s in f.samples:
                metric.add_sample(f.name + s.suffix, dict(s.labels), float(s.value))
            yield metric


def render(*families: Family) -> str:
    """One exposition of every family, in the order given."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))
    return generate_latest(registry).decode()
