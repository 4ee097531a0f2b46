"""The trajectory JSONL format: one agent per line.

Each non-empty line is one JSON object::

    {"agent": 3, "rounds": [[6120, 95], [212, 180], [0, 41]], "arrival_s": 12.5}

- `agent` (int >= 0, unique in the file): the agent id.
- `rounds` (non-empty list): round i is `[append_tokens, gen_tokens]`, both integers, with
  append_tokens >= 0 (new prompt tokens, mostly tool output; round 0 holds the task prompt) and
  gen_tokens >= 1 (tokens the replay forces the model to generate). Round i's prompt is every
  earlier append and generation plus its own append (docs/paper.md §4.2, the paper's A.3).
  A round after the first may carry a third number, `[append_tokens, gen_tokens, wait_s]`: the
  agent's tool time in seconds (finite, >= 0) between the end of round i-1 and sending round i
  (`TurnSpec.wait_s`); without it the rounds run back to back.
- `arrival_s` (optional number >= 0): when the agent starts, in seconds from the start of the
  run. Without it the experiment's arrival process decides (offline: all at 0; online: Poisson).

Blank lines are skipped; other keys are rejected so that typos do not pass silently. Readers
report the file and the 1-based line number of the first problem (as `InputError`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

from dualpath.core.request import TurnSpec
from dualpath.errors import InputError
from dualpath.workloads.jsonl import int_at_least, jsonl_objects, number_at_least_zero
from dualpath.workloads.trajectory import Trajectory

_KEYS_REQUIRED = frozenset({"agent", "rounds"})
_KEYS_ALLOWED = _KEYS_REQUIRED | {"arrival_s"}


def write_trajectories(path: str | Path, trajs: Iterable[Trajectory]) -> None:
    """Write one line per trajectory, in the given order."""
    with open(path, "w", encoding="utf-8") as f:
        for traj in trajs:
            obj: dict[str, object] = {
                "agent": traj.agent,
                "rounds": [[t.append_tokens, t.gen_tokens] for t in traj.turns],
            }
            if any(t.wait_s for t in traj.turns):
                obj["rounds"] = [[t.append_tokens, t.gen_tokens, t.wait_s] if t.wait_s else [t.append_tokens, t.gen_tokens]
                                 for t in traj.turns]
            if traj.arrival_s is not None:
                obj["arrival_s"] = traj.arrival_s
            f.write(json.dumps(obj, separators=(",", ":")))
            f.write("\n")


def read_trajectories(path: str | Path) -> tuple[Trajectory, ...]:
    """Parse and validate a trajectory JSONL file (format in the module docstring)."""
    trajs: list[Trajectory] = []
    first_line_of_agent: dict[int, int] = {}
    for obj, where, line_no in jsonl_objects(path, "trajectory file"):
        traj = _parse_object(obj, where)
        if traj.agent in first_line_of_agent:
            raise InputError(f"{where}: agent {traj.agent} already defined on line {first_line_of_agent[traj.agent]}")
        first_line_of_agent[traj.agent] = line_no
        trajs.append(traj)
    if not trajs:
        raise InputError(f"{path}: no trajectories (file is empty)")
    return tuple(trajs)


def _parse_object(obj: dict, where: str) -> Trajectory:
    missing = sorted(_KEYS_REQUIRED - obj.keys())
    if missing:
        raise InputError(f"{where}: missing key(s) {', '.join(missing)}")
    unknown = sorted(obj.keys() - _KEYS_ALLOWED)
    if unknown:
        raise InputError(f"{where}: unknown key(s) {', '.join(unknown)}")
    agent = int_at_least(obj["agent"], 0, "agent", where)
    rounds = obj["rounds"]
    if not isinstance(rounds, list) or not rounds:
        raise InputError(f"{where}: rounds must be a non-empty list of [append_tokens, gen_tokens]")
    turns = []
    for i, rnd in enumerate(rounds):
        if not isinstance(rnd, list) or len(rnd) not in (2, 3):
            raise InputError(f"{where}: round {i} must be [append_tokens, gen_tokens] or [append_tokens, gen_tokens, "
                             f"wait_s], got {rnd!r}")
        append = int_at_least(rnd[0], 0, f"round {i} append_tokens", where)
        gen = int_at_least(rnd[1], 1, f"round {i} gen_tokens", where)
        wait_s = number_at_least_zero(rnd[2], f"round {i} wait_s", where) if len(rnd) == 3 else 0.0
        if i == 0 and wait_s:
            raise InputError(f"{where}: round 0 has no wait (its agent starts at arrival_s), got {wait_s}")
        turns.append(TurnSpec(append, gen, wait_s))
    arrival_s = None
    if "arrival_s" in obj:
        arrival_s = number_at_least_zero(obj["arrival_s"], "arrival_s", where)
    return Trajectory(agent, tuple(turns), arrival_s)
