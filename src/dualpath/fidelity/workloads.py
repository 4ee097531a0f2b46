"""`dualpath fidelity`'s workloads: the same work for the runtime and the simulator.

- `demo`: the demo's agents and rounds (None here: runtime/apps/demo.py:plan_demo sizes it).
- `agents`: 8 generated agents (Table 2's 32K calibration) truncated to the model's window.
- `tiny`: 2 agents x 3 rounds (tests).
- `mooncake`: a slice of the Mooncake conversation trace (`MOONCAKE_TRACE`, or any Mooncake file
  given as the workload), rescaled to the model's window and replayed open loop (`trace_slice`).
- any trajectory JSONL file, truncated to the window.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from ..core.request import TurnSpec, usable_hit_tokens
from ..errors import InputError
from ..runtime.apps.emulation import TurnCost
from ..runtime.apps.replay import TraceWorkload
from ..workloads import Trajectory

WORKLOADS = ("demo", "agents", "tiny", "mooncake")
# The project's copy of the trace (../shared/traces/README.md), from the project root; a fresh clone
# has none: pass a Mooncake file as the workload instead.
MOONCAKE_TRACE = Path("../shared/traces/mooncake_conversation_trace.jsonl")
CPU_CONTEXT_TOKENS = 2048  # the longest context a fidelity workload sends: a CPU prefill of ~1 s (`dualpath calibrate`)
SLICE_CONVERSATIONS = 8  # as many conversations as the `agents` workload has agents
SLICE_TURNS = 4  # the first turns of each (the trace's conversations with >= 2 turns have 2-15)
WINDOW_MARGIN_TOKENS = 64  # one block below the limit, for the generated tokens' last block


def fidelity_workload(name: str, max_context_tokens: int, rounds: int | None,
                      block_tokens: int) -> list[Trajectory] | TraceWorkload | None:
    """The workload by name (module docstring); a trace's `time_scale` is 1.0 here (the run
    derives it from the rates, run.py)."""
    limit = min(max_context_tokens, CPU_CONTEXT_TOKENS) - WINDOW_MARGIN_TOKENS
    if name == "demo":
        return None
    if name == "tiny":
        turns = (TurnSpec(60, 3),) + (TurnSpec(61, 3),) * ((rounds or 3) - 1)
        return [Trajectory(a, turns) for a in range(2)]
    if name == "agents":
        from ..workloads import generate

        return [t.truncate(limit) for t in generate(32768, 8, 1, append_scale=limit / 32768)]
    if name == "mooncake":
        if not MOONCAKE_TRACE.is_file():
            raise InputError(f"the mooncake workload reads {MOONCAKE_TRACE} (from the project root), which is not "
                             f"here; pass a Mooncake trace file as --workload PATH")
        return trace_slice(MOONCAKE_TRACE, limit, block_tokens)
    path = Path(name)
    if path.is_file():
        from ..workloads import WorkloadFormat, detect_format, read_trajectories

        if detect_format(path) is WorkloadFormat.MOONCAKE:
            return trace_slice(path, limit, block_tokens)
        return [t.truncate(max_context_tokens - WINDOW_MARGIN_TOKENS) for t in read_trajectories(path)]
    raise InputError(f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}, or a trajectory or "
                     f"Mooncake JSONL file")


def trace_slice(path: Path, limit_tokens: int, block_tokens: int) -> TraceWorkload:
    """The first SLICE_CONVERSATIONS conversations (workloads/mooncake.py: infer_parents) with at
    least two turns whose first SLICE_TURNS turns fit `limit_tokens` once every trace block stands
    for one runtime block (`rescale`: 512 -> `block_tokens` tokens), in timestamp order."""
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
    num_conversations = 0
    for conv in members.values():  # in the order the conversations start
        turns = conv[:SLICE_TURNS]
        if len(turns) >= 2 and all(small[i].input_tokens + small[i].output_tokens <= limit_tokens for i in turns):
            chosen.extend(turns)
            num_conversations += 1
            if num_conversations == SLICE_CONVERSATIONS:
                break
    if not chosen:
        raise InputError(f"{path}: no conversation of two or more turns fits {limit_tokens} tokens")
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
