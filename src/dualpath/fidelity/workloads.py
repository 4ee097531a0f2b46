"""`dualpath fidelity`'s workloads: the same work for the runtime and the simulator.

A workload is a name, optionally with settings (`NAME:key=value,...`), or a file:
- `demo`: the demo's agents; setting `rounds` (0: as many as runtime/apps/demo.py:plan_demo fits in
  its target time; the workload is None here, plan_demo builds it).
- `agents`: generated agents (the generator's Table 2 calibration) truncated to the model's window;
  settings `max_len` (the generator's MaxLen, 32k), `agents` (8), `seed` (1), `gen_scale` (1.0) and
  `turns` (no limit: the first N turns of each agent). Appends are scaled to the window
  (`append_scale = window / max_len`), as the 32k default has always been.
- `tiny`: a 60-token first prompt then 61 appended tokens a round; settings `agents` (2),
  `rounds` (3) and `gen` (tokens generated a turn, 3) (tests).
- `mooncake`: a slice of the Mooncake conversation trace (the slice committed with the package,
  `MOONCAKE_TRACE`, or any Mooncake file given as the workload), rescaled to the model's window and
  replayed open loop (`trace_slice`); settings `start_s` (take conversations that start at or after
  this trace time, 0), `conversations` (8) and `load` (arrivals span the rates' predicted basic JCT
  divided by `load`, 1.0: run.py).
- any trajectory JSONL file, truncated to the window.

`WorkloadSpec.key` names a workload with every setting spelled out, so that two spellings of one
workload are recognised as the same (a workload never calibrates its own prediction: run.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..core.request import TurnSpec, usable_hit_tokens
from ..errors import InputError
from ..parsing import parse_tokens
from ..runtime.profile.emulation import TurnCost
from ..runtime.apps.replay import TraceWorkload
from ..workloads import MOONCAKE_SLICE, Trajectory

WORKLOADS = ("demo", "agents", "tiny", "mooncake")
# The trace's first 10 minutes, shipped with the package (workloads/data/README.md): every install
# has it. A longer Mooncake file can be given as the workload instead.
MOONCAKE_TRACE = MOONCAKE_SLICE
CPU_CONTEXT_TOKENS = 2048  # the longest context a fidelity workload sends: a CPU prefill of ~1 s (`dualpath calibrate`)
SLICE_CONVERSATIONS = 8  # as many conversations as the `agents` workload has agents
SLICE_TURNS = 4  # the first turns of each (the trace's conversations with >= 2 turns have 2-15)
WINDOW_MARGIN_TOKENS = 64  # one block below the limit, for the generated tokens' last block


# A built-in workload's settings and their defaults (module docstring); a file takes none.
DEFAULTS: dict[str, dict[str, str]] = {
    "demo": {"rounds": "0"}, "tiny": {"agents": "2", "rounds": "3", "gen": "3"},
    "agents": {"max_len": "32k", "agents": "8", "seed": "1", "gen_scale": "1.0", "turns": "0"},
    "mooncake": {"start_s": "0", "conversations": str(SLICE_CONVERSATIONS), "load": "1.0"},
}


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """A workload as `--workload` spells it: a built-in name with its settings, or a file."""

    name: str  # a key of DEFAULTS, or a path
    settings: tuple[tuple[str, str], ...] = ()  # every setting of a built-in, defaults filled in

    @property
    def key(self) -> str:
        """The workload with every setting spelled out (a file: its resolved path)."""
        if self.name not in DEFAULTS:
            return str(Path(self.name).resolve())
        return self.name + "".join(f"{':' if i == 0 else ','}{k}={v}" for i, (k, v) in enumerate(self.settings))

    def get(self, key: str) -> str:
        return dict(self.settings)[key]

    def number(self, key: str, kind: type = float) -> float:
        text = self.get(key)
        try:
            value = parse_tokens(text) if key == "max_len" else kind(text)
        except (InputError, ValueError):
            what = "a whole number" if kind is int else "a number"
            raise InputError(f"workload {self.name!r}: {key}={text!r} is not {what}") from None
        zero_ok = key in ("turns", "start_s", "seed") or (key, self.name) == ("rounds", "demo")  # 0: none / auto
        if value < 0 or (value == 0 and not zero_ok):
            raise InputError(f"workload {self.name!r}: {key} must be positive, got {text}")
        return value


def parse_workload(text: str) -> WorkloadSpec:
    """`NAME`, `NAME:key=value,...` or a file's path; unknown names and settings are InputErrors."""
    name, _, rest = text.partition(":")
    if name not in DEFAULTS:
        if Path(text).is_file():
            return WorkloadSpec(text)
        raise InputError(f"unknown workload {text!r}; choose one of: {', '.join(WORKLOADS)} (with settings as "
                         f"NAME:key=value,...), or a trajectory or Mooncake JSONL file")
    settings = dict(DEFAULTS[name])
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if key not in settings or not eq or not value:
            known = ", ".join(settings) or "none"
            raise InputError(f"workload {name!r}: bad setting {item!r} (settings: {known}; spelled key=value)")
        settings[key] = value
    return WorkloadSpec(name, tuple(settings.items()))


def fidelity_workload(name: str | WorkloadSpec, max_context_tokens: int, block_tokens: int) -> list[Trajectory] | TraceWorkload | None:
    """The workload (module docstring); a trace's `time_scale` is 1.0 here (the run derives it from
    the rates and the spec's `load`, run.py)."""
    spec = name if isinstance(name, WorkloadSpec) else parse_workload(name)
    limit = min(max_context_tokens, CPU_CONTEXT_TOKENS) - WINDOW_MARGIN_TOKENS
    if spec.name == "demo":
        return None
    if spec.name == "tiny":
        gen = int(spec.number("gen", int))
        turns = (TurnSpec(60, gen),) + (TurnSpec(61, gen),) * (int(spec.number("rounds", int)) - 1)
        return [Trajectory(a, turns) for a in range(int(spec.number("agents", int)))]
    if spec.name == "agents":
        return _agents(spec, limit)
    if spec.name == "mooncake":
        return trace_slice(MOONCAKE_TRACE, limit, block_tokens, spec.number("start_s"),
                           int(spec.number("conversations", int)))
    from ..workloads import WorkloadFormat, detect_format, read_agents

    path = Path(spec.name)
    if detect_format(path) is WorkloadFormat.MOONCAKE:
        return trace_slice(path, limit, block_tokens)
    return [t.truncate(max_context_tokens - WINDOW_MARGIN_TOKENS) for t in read_agents(path)]


def _agents(spec: WorkloadSpec, limit_tokens: int) -> list[Trajectory]:
    """Generated agents, appends scaled to the window, cut at it (and at `turns` turns when given)."""
    from ..workloads import generate

    max_len = int(spec.number("max_len", int))
    trajs = generate(max_len, int(spec.number("agents", int)), int(spec.number("seed", int)),
                     append_scale=limit_tokens / max_len, gen_scale=spec.number("gen_scale"))
    cut = [t.truncate(limit_tokens) for t in trajs]
    turns = int(spec.number("turns", int))
    return [Trajectory(t.agent, t.turns[:turns], t.arrival_s) for t in cut] if turns else cut


def trace_slice(path: Path, limit_tokens: int, block_tokens: int, start_s: float = 0.0,
                num_conversations: int = SLICE_CONVERSATIONS) -> TraceWorkload:
    """The first `num_conversations` conversations (workloads/mooncake.py: infer_parents) that start
    at or after `start_s` of the trace's time, with at least two turns whose first SLICE_TURNS turns
    fit `limit_tokens` once every trace block stands for one runtime block (`rescale`: 512 ->
    `block_tokens` tokens), in timestamp order."""
    from ..workloads import infer_parents, read_mooncake, rescale

    recs = sorted(read_mooncake(path), key=lambda r: r.timestamp_s)
    small = rescale(recs, block_tokens)
    parents = infer_parents(recs)
    members: dict[int, list[int]] = {}
    root: list[int] = []
    for i, p in enumerate(parents):
        root.append(i if p is None else root[p])
        members.setdefault(root[i], []).append(i)
    chosen: list[int] = []
    taken = 0
    for conv in members.values():  # in the order the conversations start
        turns = conv[:SLICE_TURNS]
        if recs[conv[0]].timestamp_s < start_s:
            continue
        if len(turns) >= 2 and all(small[i].input_tokens + small[i].output_tokens <= limit_tokens for i in turns):
            chosen.extend(turns)
            taken += 1
            if taken == num_conversations:
                break
    if not chosen:
        raise InputError(f"{path}: no conversation of two or more turns from {start_s:g} s on fits {limit_tokens} tokens")
    return TraceWorkload(tuple(small[i] for i in sorted(chosen)), 1.0)


def trace_turn_costs(records: Sequence, block_tokens: int) -> list[TurnCost]:
    """What each request hits and computes if every earlier request's prompt is stored by the
    time it arrives (closed loop; open loop can only hit less): for deriving the rates."""
    from ..workloads import Rechunker

    rechunker = Rechunker(block_tokens, records[0].block_tokens)
    stored: set[int] = set()
    out = []
    for r in records:
        ids = rechunker.rechunk(r)
        n = 0
        while n < len(ids) and ids[n] in stored:
            n += 1
        hit = usable_hit_tokens(n * block_tokens, r.input_tokens, block_tokens)
        out.append(TurnCost(hit, r.input_tokens - hit))
        stored.update(ids)
    return out
