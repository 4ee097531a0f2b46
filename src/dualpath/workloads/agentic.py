"""Agentic Mooncake traces: requests grouped into sessions, with the tool time between them.

The format NVIDIA Dynamo's agent tooling writes and its agent simulation replays (a Mooncake
trace line plus session fields): one JSON object per request,

    {"session_id": "s1", "request_id": "r2", "input_length": 7310, "output_length": 212,
     "hash_ids": [...], "timestamp": 1300, "wait_for": ["r1"], "delay": 100, "tool_wait_ms": 100}

- `session_id` (string or integer): the agent the request belongs to; a session is replayed as
  one trajectory, its requests in file order.
- `input_length` (>= 1), `output_length` (>= 0; 0 generates 1 token): tokens.
- `timestamp` (ms, optional): when the request started in the recorded run. A session's first
  request arrives at its timestamp less the trace's first one; the session's later timestamps are
  not replayed, since each later request waits for its session's previous one instead.
  Give a timestamp on every first request or on none (then the experiment's arrival process
  decides, as for a trajectory file without `arrival_s`).
- `delay` and `tool_wait_ms` (ms, optional, >= 0): after the request it waits for ends, the agent
  waits `delay + tool_wait_ms` before sending this one (the recorded gap, split into the tool's
  time and the rest); together they are `TurnSpec.wait_s`.
- `request_id`, `wait_for` (optional): a request may wait only for its own session's previous
  request; other entries of `wait_for` (a sub-agent's launch or join across sessions) are refused,
  since a trajectory is one chain. `prefix_reset` true on a later request is refused for the same
  reason (its prompt would not extend the session's context).
- `hash_ids`, `branches` and other keys are read past: an agent's prefix is its own context
  (`Trajectory`), so ids shared across sessions do not make hits here.

A request's prompt is the session's context (earlier prompts and outputs) plus its append:
append = input_length - (previous input_length + previous output). Where a recorded prompt is
shorter than that context (a reasoning model's thoughts dropped from the next prompt, say), the
append is 0 and the replayed prompt is the context, longer than recorded: `AgenticTrace` counts
those requests and the tokens they add, and `trajectory_stats` is taken on what is replayed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads.jsonl import WorkloadFormat, detect_format, int_at_least, jsonl_objects, number_at_least_zero
from dualpath.workloads.jsonl_format import read_trajectories
from dualpath.workloads.trajectory import Trajectory

MS_PER_S = 1000.0


@dataclass(frozen=True, slots=True)
class AgenticTrace:
    trajectories: tuple[Trajectory, ...]  # one per session, in order of first appearance
    lengthened_requests: int  # prompts replayed longer than recorded (module docstring)
    lengthened_tokens: int


@dataclass(slots=True)
class _Session:
    first_where: str
    arrival_s: float | None
    turns: list[TurnSpec]
    end_tokens: int  # context after the last request: its prompt and output
    last_request_id: object


def read_agents(path: str | Path) -> tuple[Trajectory, ...]:
    """The agents of a trajectory JSONL or an agentic Mooncake trace, whichever `path` holds (a
    plain Mooncake trace is requests, not agents: `InputError`)."""
    fmt = detect_format(path)
    if fmt is WorkloadFormat.TRAJECTORY:
        return read_trajectories(path)
    if fmt is WorkloadFormat.AGENTIC:
        return read_agentic(path).trajectories
    raise InputError(f"{path}: a Mooncake trace of requests, where agents (trajectory JSONL or an agentic trace "
                     f"with session_id) are needed")


def read_agentic(path: str | Path) -> AgenticTrace:
    """Parse an agentic Mooncake trace (module docstring); `InputError` names the line of the first problem."""
    sessions: dict[object, _Session] = {}
    lengthened = [0, 0]
    for obj, where, _ in jsonl_objects(path, "agentic Mooncake trace"):
        _add_request(sessions, obj, where, lengthened)
    if not sessions:
        raise InputError(f"{path}: no requests (file is empty)")
    starts = [s.arrival_s for s in sessions.values() if s.arrival_s is not None]
    if starts and len(starts) != len(sessions):
        untimed = next(s for s in sessions.values() if s.arrival_s is None)
        raise InputError(f"{untimed.first_where}: a session's first request has no timestamp while others have one: "
                         f"give every session's first request a timestamp, or none")
    first_s = min(starts, default=0.0)
    trajs = tuple(Trajectory(k, tuple(s.turns), None if s.arrival_s is None else s.arrival_s - first_s)
                  for k, s in enumerate(sessions.values()))
    return AgenticTrace(trajs, lengthened[0], lengthened[1])


def _add_request(sessions: dict[object, _Session], obj: dict, where: str, lengthened: list[int]) -> None:
    for key in ("session_id", "input_length", "output_length"):
        if key not in obj:
            raise InputError(f"{where}: missing field {key}")
    sid = obj["session_id"]
    if not isinstance(sid, (str, int)) or isinstance(sid, bool):
        raise InputError(f"{where}: session_id must be a string or an integer, got {sid!r}")
    input_tokens = int_at_least(obj["input_length"], 1, "input_length", where)
    gen_tokens = max(1, int_at_least(obj["output_length"], 0, "output_length", where))
    wait_ms = sum(number_at_least_zero(obj.get(k, 0), k, where) for k in ("delay", "tool_wait_ms"))
    arrival_s = number_at_least_zero(obj["timestamp"], "timestamp", where) / MS_PER_S if "timestamp" in obj else None
    session = sessions.get(sid)
    _check_dependencies(obj, where, session)
    if session is None:
        # the first request's own delay postpones its session's start
        start_s = None if arrival_s is None else arrival_s + wait_ms / MS_PER_S
        sessions[sid] = _Session(where, start_s, [TurnSpec(input_tokens, gen_tokens)], input_tokens + gen_tokens,
                                 obj.get("request_id"))
        return
    append = input_tokens - session.end_tokens
    if append < 0:
        lengthened[0] += 1
        lengthened[1] += -append
        append = 0
    session.turns.append(TurnSpec(append, gen_tokens, wait_ms / MS_PER_S))
    session.end_tokens += append + gen_tokens
    session.last_request_id = obj.get("request_id")


def _check_dependencies(obj: dict, where: str, session: _Session | None) -> None:
    if obj.get("prefix_reset") is True and session is not None:
        raise InputError(f"{where}: prefix_reset on a later request of session {obj['session_id']!r}: a session is "
                         f"replayed as one trajectory, whose every prompt extends its context")
    wait_for = obj.get("wait_for", [])
    if not isinstance(wait_for, list):
        raise InputError(f"{where}: wait_for must be a list of request ids, got {wait_for!r}")
    allowed = [] if session is None or session.last_request_id is None else [session.last_request_id]
    other = [w for w in wait_for if w not in allowed]
    if other:
        raise InputError(f"{where}: wait_for {other!r}: a request may wait only for its session's previous request "
                         f"(a session is replayed as one chain; dependencies across sessions are not supported)")
