"""The calibration knobs behind every simulation of the report, with their values and sources.

Read from the config classes themselves: a field's source is its trailing comment or the block of
comment lines right above it (the convention of `config.py` and `core/hardware.py`), else its
class's docstring. So the report lists exactly the knobs the code has, with the value it runs and
the source written next to it; a knob without a written source shows as such.

Each knob's kind is read from the same comment (the convention of `config.py`'s docstring):
- `fitted (FIGURE; hardware-only: section.field=value, ...): ...` - fitted to the paper's own data
  (FIGURE); the assignments give the estimate from hardware sources alone, which the experiments
  simulate beside every headline that depends on the knob (`hardware_only_assignments`);
- `choice: ...` - this project's choice (the paper and the hardware sources give no value);
- otherwise the cited source: HARDWARE.md (or an [S-...] tag) = hardware-sourced, PAPER.md = a
  setting the paper states; a knob citing neither is `unclassified` (a test keeps there none).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache
from typing import Any

from ..config import ClusterConfig, ComputeKnobs, MetricsConfig, SchedulerConfig
from ..core.hardware import GPUS

NO_SOURCE = "(no source written)"
# Per-experiment settings rather than calibration: each experiment's section states them.
_SETTINGS = {"cluster.model", "cluster.gpu", "cluster.num_prefill_nodes", "cluster.num_decode_nodes",
             "cluster.cnic_kv_flood", "cluster.ep_ignores_kv", "scheduler.lane_weights.one_class",
             "cluster.cnic_as_runtime_arbiter", "cluster.decode_waits_for_step_end",
             "cluster.persist_waits_for_snic_write", "cluster.persist_wait_s", "cluster.buffers_at_placement"}  # the `local` preset's, not the paper presets'
_FIELD_RE = re.compile(r"^(\w+)\s*:")
_FITTED_RE = re.compile(r"^fitted \((?P<figure>[^;)]+)(?:; hardware-only: (?P<hw>[^)]*))?\):\s*")
_CHOICE_RE = re.compile(r"^choice:\s*")
KIND_LABELS = {"hardware": "hardware-sourced", "paper": "paper setting", "fitted": "fitted", "choice": "project choice",
               "unclassified": "unclassified"}


@dataclass(frozen=True, slots=True)
class Knob:
    name: str  # dotted path in SimConfig (`--set` spelling), or "gpu (NAME)"
    value: Any  # the default the report's runs use
    source: str  # the comment written beside the field, without its kind marker
    kind: str  # a key of KIND_LABELS
    figure: str = ""  # fitted knobs: the paper's figure the value is fitted to
    hardware_only: tuple[str, ...] = ()  # fitted knobs: `--set` assignments of the hardware-only estimate

    @property
    def kind_label(self) -> str:
        return f"fitted to {self.figure}" if self.kind == "fitted" else KIND_LABELS[self.kind]

    def to_dict(self) -> dict[str, Any]:
        return {"knob": self.name, "value": self.value, "source": self.source, "kind": self.kind,
                "figure": self.figure, "hardware_only": list(self.hardware_only)}


def classify(name: str, value: Any, comment: str) -> Knob:
    """A knob from its comment: the kind marker (module docstring), else the source it cites."""
    m = _FITTED_RE.match(comment)
    if m:
        hw = tuple(a.strip() for a in (m.group("hw") or "").split(",") if a.strip())
        return Knob(name, value, comment[m.end():], "fitted", m.group("figure").strip(), hw)
    m = _CHOICE_RE.match(comment)
    if m:
        return Knob(name, value, comment[m.end():], "choice")
    if "HARDWARE.md" in comment or "[S-" in comment:
        return Knob(name, value, comment, "hardware")
    return Knob(name, value, comment, "paper" if "PAPER.md" in comment else "unclassified")


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


def knob_rows(obj: Any, prefix: str) -> list[Knob]:
    """Every leaf field of the dataclass `obj` (nested ones expanded), classified by its comment."""
    cls = type(obj)
    sources = field_sources(cls)
    rows: list[Knob] = []
    for f in fields(cls):
        name, value = f"{prefix}.{f.name}", getattr(obj, f.name)
        if is_dataclass(value):
            rows += knob_rows(value, name)
        elif name not in _SETTINGS:
            rows.append(classify(name, value, sources.get(f.name) or _doc(cls) or NO_SOURCE))
    return rows


def all_knob_rows(gpu: str = "h800") -> list[Knob]:
    """The default knobs (`dualpath.config`) and the GPU preset the report's runs use."""
    rows = (knob_rows(ComputeKnobs(), "compute") + knob_rows(SchedulerConfig(), "scheduler")
            + knob_rows(ClusterConfig(), "cluster") + knob_rows(MetricsConfig(), "metrics"))
    g = GPUS[gpu]
    value = (f"{g.bf16_flops_per_s / 1e12:g} / {g.fp8_flops_per_s / 1e12:g} TFLOPS BF16 / FP8, "
             f"{g.hbm_bytes / 1e9:g} GB HBM at {g.hbm_bytes_per_s / 1e12:g} TB/s")
    return rows + [classify(f"gpu ({gpu})", value, _gpu_source())]


def fitted_knobs() -> list[Knob]:
    return [k for k in all_knob_rows() if k.kind == "fitted"]


@lru_cache(maxsize=1)
def hardware_only_assignments() -> tuple[str, ...]:
    """`--set` assignments that put every fitted knob at its hardware-only estimate (SimSpec.knobs)."""
    return tuple(dict.fromkeys(a for k in fitted_knobs() for a in k.hardware_only))


def fitted_knob_names() -> tuple[str, ...]:
    return tuple(k.name for k in fitted_knobs())


def _gpu_source() -> str:
    """The comment above the GPU presets in core/hardware.py."""
    from ..core import hardware

    src = inspect.getsource(hardware)
    m = re.search(r"((?:^#.*\n)+)H800 = GpuSpec", src, flags=re.M)
    return " ".join(line.lstrip("#").strip() for line in m.group(1).splitlines()) if m else NO_SOURCE


def knobs_markdown() -> str:
    rows = all_knob_rows()
    lines = [
        "Every calibration knob the simulations use, with its value, its kind and the source written beside it in "
        "the code (`dualpath/config.py`, `dualpath/core/hardware.py`); `--set section.field=value` overrides one in "
        "`dualpath sim`. Kind, read from the same comment: hardware-sourced (HARDWARE.md: vendor, kernel and fleet "
        "numbers), paper setting (a value PAPER.md states), fitted (to the paper's own results: which figure; the "
        "hardware-only estimate each headline shows beside it is in the source column), project choice (neither "
        "gives a value). Model presets (FLOPs, KV bytes per token) are in `dualpath/core/models.py` with their "
        "sources; per model, `paper_cluster()` sets the DRAM buffer (80 GB DeepSeek, 320 GB Qwen) and expert "
        "parallelism (PAPER.md 5).",
        "",
        "| knob | value | kind | source |",
        "|---|---|---|---|",
    ]
    for k in rows:
        hw = f" Hardware-only estimate: `{', '.join(k.hardware_only)}`." if k.hardware_only else ""
        lines.append(f"| `{k.name}` | {_fmt(k.value)} | {k.kind_label} | {k.source}{hw} |")
    return "\n".join(lines)


def calibration_sentence() -> str:
    """What the report says about tuning, from the knob kinds (never a hard-coded claim)."""
    rows = all_knob_rows()
    fitted = [k for k in rows if k.kind == "fitted"]
    counts = {kind: sum(1 for k in rows if k.kind == kind) for kind in KIND_LABELS}
    plural = {"hardware": "hardware-sourced", "paper": "paper settings", "choice": "project choices", "unclassified": "unclassified"}
    parts = [f"{counts[kind]} {plural[kind]}" for kind in plural if counts[kind]]
    if not fitted:
        return f"No knob is fitted to the paper's own results ({', '.join(parts)})."
    names = ", ".join(f"`{k.name}`" for k in fitted)
    figures = ", ".join(dict.fromkeys(k.figure for k in fitted))
    return (f"{len(fitted)} of the {len(rows)} knobs are fitted to the paper's own data ({names}: {figures}); the "
            f"others are {', '.join(parts)}. Every headline that depends on a fitted knob shows beside it the value "
            "the simulator gives with that knob at its hardware-only estimate "
            f"(`{', '.join(hardware_only_assignments())}`).")


def _fmt(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (abs(value) >= 1e6 or (value and abs(value) < 1e-2)):
        return f"{value:.4g}"
    return str(value)
