"""The calibration knobs behind every simulation of the report, with their values and sources.

Read from the code itself: a config field's source is its trailing comment or the block of
comment lines right above it (the convention of `config/sim.py` and `costmodel/hardware.py`), else its
class's docstring; a module constant's (the GPU presets, the workload generator's parameters in
`workloads/generator.py`) by the same rule (`comment_sources`). So the report lists exactly the
knobs the code has, with the value it runs and the source written next to it; a knob without a
written source shows as such.

Each knob's kind is read from the same comment (the convention of the `config` package docstring):
- `fitted (FIGURE; hardware-only: section.field=value, ...): ...` - fitted to the paper's own data
  (FIGURE: a figure or table); the assignments give the estimate from hardware sources alone,
  which the experiments simulate beside every headline that depends on the knob
  (`hardware_only_assignments`); a fitted knob without them has no such estimate (Table 2's
  generator parameters define the workload, not the hardware);
- `choice: ...` - this project's choice (the paper and the hardware sources give no value);
- otherwise the cited source: docs/hardware.md (or an [S-...] tag) = hardware-sourced, docs/paper.md = a
  setting the paper states; a knob citing neither is `unclassified` (a test keeps there none).
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass, fields, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Collection, Iterable

from ..config import ClusterConfig, ComputeKnobs, MetricsConfig, SchedulerConfig
from ..costmodel import hardware
from ..workloads import generator

NO_SOURCE = "(no source written)"
# Per-experiment settings rather than calibration: each experiment's section states them.
_SETTINGS = {"cluster.model", "cluster.gpu", "cluster.num_prefill_nodes", "cluster.num_decode_nodes",
             "cluster.cnic_kv_flood", "cluster.ep_ignores_kv", "scheduler.lane_weights.one_class",
             "cluster.cnic_as_runtime_arbiter", "cluster.decode_waits_for_step_end",
             "cluster.persist_waits_for_snic_write", "cluster.persist_wait_s", "cluster.buffers_at_placement"}  # the `local` preset's, not the paper presets'
_DEF_RE = re.compile(r"^(\w+)\s*[:=]")  # a field (`name: type = ...`) or a module constant (`NAME = ...`)
_FITTED_RE = re.compile(r"^fitted \((?P<figure>[^;)]+)(?:; hardware-only: (?P<hw>[^)]*))?\):\s*")
_CHOICE_RE = re.compile(r"^choice:\s*")
KIND_LABELS = {"hardware": "hardware-sourced", "paper": "paper setting", "fitted": "fitted", "choice": "project choice",
               "unclassified": "unclassified"}
# The workload generator's knobs (workloads/generator.py) besides its fitted CALIBRATED parameters:
# the shape of every trajectory. The MaxLen bounds it accepts and its work-array sizes are not knobs.
GENERATOR_CONSTANTS = ("BASE_SET_SIZE", "EXTRA_PREFIX_TOKENS", "FIRST_PROMPT_SIGMA", "FIRST_PROMPT_CAP_FRACTION",
                       "APPEND_TURN_SIGMA", "GEN_RATE_SIGMA", "GEN_TURN_SIGMA", "GEN_CAP_FRACTION", "MAX_TURNS_UP_TO_64K")
# The runtime demo's knobs, behind no headline of this report (the simulations never read them).
_DEMO_SOURCE = Path(__file__).resolve().parents[1] / "runtime" / "profile" / "emulation.py"
_DEMO_CONSTANTS = ("LOAD_OVER_COMPUTE",)


@dataclass(frozen=True, slots=True)
class Knob:
    name: str  # dotted path in SimConfig (`--set` spelling), "gpu (NAME)", or "generator.NAME" (a module constant)
    value: Any  # the default the report's runs use
    source: str  # the comment written beside the field, without its kind marker
    kind: str  # a key of KIND_LABELS
    figure: str = ""  # fitted knobs: the paper's figure or table the value is fitted to
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
    if "docs/hardware.md" in comment or "[S-" in comment:
        return Knob(name, value, comment, "hardware")
    return Knob(name, value, comment, "paper" if "docs/paper.md" in comment else "unclassified")


def field_sources(cls: type) -> dict[str, str]:
    """Field name -> its comment text (`comment_sources`)."""
    return comment_sources(inspect.getsource(cls).splitlines()[1:], {f.name for f in fields(cls)})


def module_sources(module: Any, names: Collection[str]) -> dict[str, str]:
    """Module constant -> its comment text, by the rule of a field's (`comment_sources`)."""
    return comment_sources(inspect.getsource(module).splitlines(), names)


def comment_sources(lines: Iterable[str], names: Collection[str]) -> dict[str, str]:
    """Name -> the comment text of its definition among `lines`: the block above, then the
    trailing comment. A definition with neither, right below one with a comment block, shares that
    block (one comment for a group of fields); a blank line ends the group."""
    out: dict[str, str] = {}
    pending: list[str] = []
    group = ""
    for raw in lines:
        line = raw.strip()
        if line.startswith("#"):
            pending.append(line.lstrip("#").strip())
            continue
        m = _DEF_RE.match(line)
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
    g = hardware.GPUS[gpu]
    value = (f"{g.bf16_flops_per_s / 1e12:g} / {g.fp8_flops_per_s / 1e12:g} TFLOPS BF16 / FP8, "
             f"{g.hbm_bytes / 1e9:g} GB HBM at {g.hbm_bytes_per_s / 1e12:g} TB/s")
    gpu_source = module_sources(hardware, ("H800",)).get("H800") or NO_SOURCE  # the comment above the presets
    return rows + [classify(f"gpu ({gpu})", value, gpu_source)] + generator_rows()


def generator_rows() -> list[Knob]:
    """The workload generator's knobs: GENERATOR_CONSTANTS, then each MaxLen anchor's fitted
    `GeneratorParams` (`generator.CALIBRATED`), all classified by the comment above them."""
    sources = module_sources(generator, (*GENERATOR_CONSTANTS, "CALIBRATED"))
    rows = [classify(f"generator.{name}", getattr(generator, name), sources.get(name) or NO_SOURCE)
            for name in GENERATOR_CONSTANTS]
    for max_len, params in generator.CALIBRATED.items():
        rows += [classify(f"generator.CALIBRATED[{max_len // 1024}K].{f.name}", getattr(params, f.name),
                          sources.get("CALIBRATED") or NO_SOURCE) for f in fields(params)]
    return rows


def demo_knob_rows() -> list[Knob]:
    """The runtime demo's knobs (runtime/profile/emulation.py), classified by the same rule. Read from
    the file's text: experiments/ imports nothing of runtime/apps/ (tests/core/test_imports.py)."""
    lines = _DEMO_SOURCE.read_text().splitlines()
    sources = comment_sources(lines, _DEMO_CONSTANTS)
    values = {m.group(1): ast.literal_eval(line.split("=", 1)[1].split("#", 1)[0].strip())
              for line in lines if (m := _DEF_RE.match(line)) and m.group(1) in _DEMO_CONSTANTS}
    return [classify(f"runtime demo: {name}", values[name], sources.get(name) or NO_SOURCE) for name in _DEMO_CONSTANTS]


def fitted_knobs() -> list[Knob]:
    return [k for k in all_knob_rows() if k.kind == "fitted"]


@lru_cache(maxsize=1)
def hardware_only_assignments() -> tuple[str, ...]:
    """`--set` assignments that put every fitted knob at its hardware-only estimate (SimSpec.knobs)."""
    return tuple(dict.fromkeys(a for k in fitted_knobs() for a in k.hardware_only))


def hardware_only_knob_names() -> tuple[str, ...]:
    """The fitted knobs with a hardware-only estimate: those a headline's hardware-only value varies."""
    return tuple(k.name for k in fitted_knobs() if k.hardware_only)


def knob_counts() -> dict[str, Any]:
    """Knobs behind the simulations by kind; the fitted ones by the figure or table they fit."""
    rows = all_knob_rows()
    counts: dict[str, Any] = {kind: sum(1 for k in rows if k.kind == kind) for kind in KIND_LABELS if kind != "fitted"}
    fitted = [k.figure for k in rows if k.kind == "fitted"]
    counts["fitted"] = {figure: fitted.count(figure) for figure in dict.fromkeys(fitted)}
    return counts


def knobs_markdown() -> str:
    lines = [
        "Every calibration knob the simulations use, with its value, its kind and the source written beside it in "
        "the code (`dualpath/config/sim.py`, `dualpath/costmodel/hardware.py`, `dualpath/workloads/generator.py`); `--set "
        "section.field=value` overrides a config one in `dualpath sim`. Kind, read from the same comment: "
        "hardware-sourced (docs/hardware.md: vendor, kernel and fleet numbers), paper setting (a value docs/paper.md "
        "states), fitted (to the paper's own data: which figure or table; the hardware-only estimate each headline "
        "shows beside it, where there is one, is in the source column), project choice (neither gives a value). "
        "Model presets (FLOPs, KV bytes per token) are in `dualpath/costmodel/models.py` with their sources; per model, "
        "`paper_cluster()` sets the DRAM buffer (80 GB DeepSeek, 320 GB Qwen) and expert parallelism "
        "(docs/paper.md §5).",
        "",
        _knob_table(all_knob_rows()),
        "",
        "Behind no headline of this report (the simulations never read them), the runtime demo's (`dualpath demo`):",
        "",
        _knob_table(demo_knob_rows()),
    ]
    return "\n".join(lines)


def _knob_table(rows: list[Knob]) -> str:
    lines = ["| knob | value | kind | source |", "|---|---|---|---|"]
    for k in rows:
        hw = f" Hardware-only estimate: `{', '.join(k.hardware_only)}`." if k.hardware_only else ""
        lines.append(f"| `{k.name}` | {_fmt(k.value)} | {k.kind_label} | {k.source}{hw} |")
    return "\n".join(lines)


def knob_count_sentence() -> str:
    """How many knobs of each kind stand behind the simulated headlines (`knob_counts`)."""
    c = knob_counts()
    plural = {"hardware": "hardware-sourced", "paper": "paper settings", "choice": "project choices", "unclassified": "unclassified"}
    parts = [f"{c[kind]} {plural[kind]}" for kind in plural if c.get(kind)]
    fitted = c["fitted"]
    if fitted:
        by_figure = ", ".join(f"{n} to {figure}" for figure, n in fitted.items())
        parts.append(f"{sum(fitted.values())} fitted to the paper's own data ({by_figure})")
    return f"{sum(v for k, v in c.items() if k != 'fitted') + sum(fitted.values())} knobs: {', '.join(parts)}"


def calibration_sentence() -> str:
    """What the report says about tuning, from the knob kinds (never a hard-coded claim)."""
    fitted = fitted_knobs()
    if not fitted:
        return "No knob is fitted to the paper's own data."
    by_figure: dict[str, list[str]] = {}
    for k in fitted:
        by_figure.setdefault(k.figure, []).append(re.sub(r"\[.*", "", k.name))  # CALIBRATED[64K].x -> CALIBRATED
    named = "; ".join(f"{figure}: " + ", ".join(f"`{n}`" + (f" ({names.count(n)} values)" if names.count(n) > 1 else "")
                                               for n in dict.fromkeys(names)) for figure, names in by_figure.items())
    without = [k.figure for k in fitted if not k.hardware_only]
    hw = hardware_only_assignments()
    return (f"Fitted to the paper's own data: {named}. Every headline that depends on a fitted knob with a hardware-only "
            f"estimate shows beside it the value the simulator gives with that knob at the estimate (`{', '.join(hw) or '-'}`)"
            + (f"; those fitted to {', '.join(dict.fromkeys(without))} have none: they define the workload, not the "
               "hardware, and every simulated headline rests on them." if without else "."))


def _fmt(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and (abs(value) >= 1e6 or (value and abs(value) < 1e-2)):
        return f"{value:.4g}"
    return str(value)
