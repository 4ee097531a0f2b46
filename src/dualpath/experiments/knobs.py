"""The calibration knobs behind every simulation of the report, with their values and sources.

Read from the config classes themselves: a field's source is its trailing comment or the block of
comment lines right above it (the convention of `config.py` and `core/hardware.py`), else its
class's docstring. So the report lists exactly the knobs the code has, with the value it runs and
the source written next to it; a knob without a written source shows as such.
"""

from __future__ import annotations

import inspect
import re
from dataclasses import fields, is_dataclass
from typing import Any

from ..config import ClusterConfig, ComputeKnobs, SchedulerConfig
from ..core.hardware import GPUS

NO_SOURCE = "(no source written)"
# Per-experiment settings rather than calibration: each experiment's section states them.
_SETTINGS = {"cluster.model", "cluster.gpu", "cluster.num_prefill_nodes", "cluster.num_decode_nodes"}
_FIELD_RE = re.compile(r"^(\w+)\s*:")


def field_sources(cls: type) -> dict[str, str]:
    """Field name -> its comment text: the block above, then the trailing comment. A field with
    neither, right below a field with a comment block, shares that block (one comment for a
    group of fields); a blank line ends the group."""
    names = {f.name for f in fields(cls)}
    out: dict[str, str] = {}
    pending: list[str] = []
    group = ""
    for raw in inspect.getsource(cls).splitlines()[1:]:
        line = raw.strip()
        if line.startswith("#"):
            pending.append(line.lstrip("#").strip())
            continue
        m = _FIELD_RE.match(line)
        if m and m.group(1) in names:
            _, _, trailing = line.partition("  # ")
            if pending:
                group = " ".join(pending)
            own = " ".join(pending + ([trailing.strip()] if trailing else []))
            out[m.group(1)] = own or group
        else:
            group = ""
        pending = []
    return out


def _doc(cls: type) -> str:
    """The class's own docstring (not the signature dataclasses write when there is none)."""
    doc = cls.__doc__ or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return inspect.cleandoc(doc).split("\n\n")[0].replace("\n", " ")


def knob_rows(obj: Any, prefix: str) -> list[tuple[str, Any, str]]:
    """(dotted name, value, source) for every leaf field of the dataclass `obj`, nested ones expanded."""
    cls = type(obj)
    sources = field_sources(cls)
    rows: list[tuple[str, Any, str]] = []
    for f in fields(cls):
        name, value = f"{prefix}.{f.name}", getattr(obj, f.name)
        if is_dataclass(value):
            rows += knob_rows(value, name)
        elif name not in _SETTINGS:
            rows.append((name, value, sources.get(f.name) or _doc(cls) or NO_SOURCE))
    return rows


def all_knob_rows(gpu: str = "h800") -> list[tuple[str, Any, str]]:
    """The default knobs (`dualpath.config`) and the GPU preset the report's runs use."""
    rows = knob_rows(ComputeKnobs(), "compute") + knob_rows(SchedulerConfig(), "scheduler") + knob_rows(ClusterConfig(), "cluster")
    g = GPUS[gpu]
    value = (f"{g.bf16_flops_per_s / 1e12:g} / {g.fp8_flops_per_s / 1e12:g} TFLOPS BF16 / FP8, "
             f"{g.hbm_bytes / 1e9:g} GB HBM at {g.hbm_bytes_per_s / 1e12:g} TB/s")
    return rows + [(f"gpu ({gpu})", value, _gpu_source())]


def _gpu_source() -> str:
    """The comment above the GPU presets in core/hardware.py."""
    from ..core import hardware

    src = inspect.getsource(hardware)
    m = re.search(r"((?:^#.*\n)+)H800 = GpuSpec", src, flags=re.M)
    return " ".join(line.lstrip("#").strip() for line in m.group(1).splitlines()) if m else NO_SOURCE


def knobs_markdown() -> str:
    rows = all_knob_rows()
    lines = [
        "Every calibration knob the simulations use, with its value and the source written beside it in the code "
        "(`dualpath/config.py`, `dualpath/core/hardware.py`); `--set section.field=value` overrides one in `dualpath sim`. "
        "Model presets (FLOPs, KV bytes per token) are in `dualpath/core/models.py` with their sources; per model, "
        "`paper_cluster()` sets the DRAM buffer (80 GB DeepSeek, 320 GB Qwen) and expert parallelism (PAPER.md 5).",
        "",
        "| knob | value | source |",
        "|---|---|---|",
    ]
    lines += [f"| `{name}` | {_fmt(value)} | {source} |" for name, value, source in rows]
    return "\n".join(lines)


def _fmt(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (abs(value) >= 1e6 or (value and abs(value) < 1e-2)):
        return f"{value:.4g}"
    return str(value)
