"""Prometheus text exposition format (version 0.0.4), written by hand: one metric family at a time.

    # HELP <name> <help>
    # TYPE <name> counter|gauge
    <name>{label="value",...} <number>

`render_family` escapes label values and help text as the format requires; `join_families`
concatenates texts from several sources (router, server) into one exposition.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping

CONTENT_TYPE = "text/plain; version=0.0.4"

MetricKind = Literal["counter", "gauge", "untyped"]


@dataclass(frozen=True, slots=True)
class Sample:
    value: float
    labels: Mapping[str, str] = field(default_factory=dict)


def _escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render_family(name: str, kind: MetricKind, help_text: str, samples: Iterable[Sample]) -> str:
    """One metric family; ends with a newline. Label names are written in the order given."""
    lines = [f"# HELP {name} {_escape_help(help_text)}", f"# TYPE {name} {kind}"]
    for sample in samples:
        labels = ",".join(f'{k}="{_escape_label_value(v)}"' for k, v in sample.labels.items())
        series = f"{name}{{{labels}}}" if labels else name
        lines.append(f"{series} {format_value(sample.value)}")
    return "\n".join(lines) + "\n"


def join_families(*texts: str) -> str:
    """Concatenate expositions, each ending with exactly one newline; empty texts are dropped."""
    return "".join(t if t.endswith("\n") else t + "\n" for t in texts if t.strip())
