"""The one JSONL reader under both workload formats (trajectory JSONL, Mooncake traces) and the
format detection: each format parses the objects; this module reads the lines.

Errors are `InputError`s that name the file and the 1-based line of the first problem.
"""

from __future__ import annotations

import enum
import json
import math
from pathlib import Path
from typing import Iterator

from dualpath.errors import InputError


class WorkloadFormat(enum.Enum):
    TRAJECTORY = "trajectory"
    MOONCAKE = "mooncake"
    AGENTIC = "agentic"  # a Mooncake trace with sessions (workloads/agentic.py)


def jsonl_objects(path: str | Path, what: str) -> Iterator[tuple[dict, str, int]]:
    """(object, "PATH line N", N) for every non-blank line; `what` names the file in errors."""
    try:
        f = open(path, "rb")
    except OSError as e:
        raise InputError(f"cannot read {what} {path}: {e.strerror}") from None
    with f:
        for line_no, raw in enumerate(f, start=1):
            where = f"{path} line {line_no}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise InputError(f"{where}: not UTF-8 text (byte {e.start + 1})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(f"{where}: bad JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(obj, dict):
                raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            yield obj, where, line_no


def int_at_least(value: object, minimum: int, name: str, where: str) -> int:
    # bool is an int subclass in Python; `true` is not a token count.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InputError(f"{where}: {name} must be an integer, got {value!r}")
    if value < minimum:
        raise InputError(f"{where}: {name} must be >= {minimum}, got {value}")
    return value


def number_at_least_zero(value: object, name: str, where: str) -> float:
    """A finite number >= 0 (a time, say; `true` is not one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def detect_format(path: str | Path) -> WorkloadFormat:
    """From the first object's keys: `rounds` -> trajectory JSONL, `session_id` -> agentic Mooncake
    trace (sessions of requests), `hash_ids` -> Mooncake trace (requests)."""
    for obj, where, _ in jsonl_objects(path, "workload file"):
        if "rounds" in obj:
            return WorkloadFormat.TRAJECTORY
        if "session_id" in obj:
            return WorkloadFormat.AGENTIC
        if "hash_ids" in obj:
            return WorkloadFormat.MOONCAKE
        raise InputError(f"{where}: unknown workload format: expected a 'rounds' key (trajectory JSONL), "
                         f"a 'session_id' key (agentic Mooncake trace) or a 'hash_ids' key (Mooncake trace)")
    raise InputError(f"{path}: empty workload file")
