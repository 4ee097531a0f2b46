"""The scheduling decisions of a run, written the same way by both worlds (issue: the simulator
predicts the real system; `dualpath fidelity` compares the two logs request by request).

A decision is complete when a pass picks a request's DE and read side (its PE was picked by an
earlier or the same pass, docs/paper.md §3.1-3.4). `dualpath sim --decisions F` and `dualpath run
--decisions F` write one JSONL file per mode (`decisions_path`); `fidelity` keeps both worlds' logs
in its report (`modes.<mode>.decision_logs`). One object per decision:

    {"request": "a3t2", "t_s": 12.5, "pe": 0, "de": 1, "side": "decode", "hit_tokens": 1920, "pe_part_tokens": 0,
     "pe_cost_tokens": 640, "de_cost_tokens": 0}

- `request`: the request's name, `a<agent>t<turn>` (the simulator's `RequestId`, the runtime
  replay's request id); record i of a Mooncake trace is the one-turn agent `a<i>t0`.
- `t_s`: seconds since the log was opened (the run's start: the simulator's t = 0; the runtime's
  clock when the replay began).
- `pe`, `de`: the engine's index among the engines of its role, in id order (0-based), the same
  numbering in both worlds (the simulator's engine ids count GPUs over nodes; the runtime's one
  engine per node).
- `side`: "prefill" or "decode"; `hit_tokens`: the tokens the pass counted in that side's read
  queue (0: nothing to read).
- `pe_part_tokens`: a split read (`dualpath+split`, core/policy/split.py; side "decode"): the prefix
  of `hit_tokens` the PE node reads, the other `hit_tokens - pe_part_tokens` read by the DE node;
  0: not split (a log written before the field reads as 0).
- `pe_cost_tokens`, `de_cost_tokens`: what the read-side rule compared (core/scheduler.py,
  `DecodeAssignment`): each side's read queue in tokens, with `+dram` plus the hit tokens that side
  must read from storage (0 when its DRAM holds the whole hit); -1: the rule compared nothing
  (basic, a forced side; a log written before the fields).

Lines appear in decision order (within one pass, the pass's order).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

_SIDES = ("prefill", "decode")  # by ReadSide value


@dataclass(frozen=True, slots=True)
class Decision:
    request: str
    t_s: float
    pe: int
    de: int
    side: str
    hit_tokens: int
    pe_part_tokens: int = 0
    pe_cost_tokens: int = -1
    de_cost_tokens: int = -1


class DecisionLog:
    """Decisions in memory, in decision order. `t0_s`: the clock's time at the start."""

    def __init__(self, t0_s: float = 0.0) -> None:
        self.t0_s = t0_s
        self.decisions: list[Decision] = []

    def record(self, request: str, now_s: float, pe: int, de: int, side: int, hit_tokens: int,
               pe_part_tokens: int = 0, pe_cost_tokens: int = -1, de_cost_tokens: int = -1) -> None:
        self.decisions.append(Decision(request, now_s - self.t0_s, pe, de, _SIDES[side], hit_tokens, pe_part_tokens,
                                       pe_cost_tokens, de_cost_tokens))


@dataclass(frozen=True, slots=True)
class Agreement:
    """How often two logs of the same work decided alike, over the requests both decided."""

    num_common: int  # requests in both logs
    num_only_a: int
    num_only_b: int
    same_side: float  # fraction of common requests read on the same side
    same_pe: float
    same_de: float
    same_hit: float  # fraction with equal hit tokens
    # of the common requests read on different sides (and compared by both logs' read-side rule), the
    # fraction that either log decided within `tie_tokens` of a tie: a choice a block of timing flips
    near_tie: float = float("nan")

    def to_json(self) -> dict:
        return asdict(self)


def near_tie(d: Decision, tie_tokens: int) -> bool:
    """The read-side rule compared the two sides' costs (dualpath's) and they were within `tie_tokens`."""
    return d.pe_cost_tokens >= 0 and d.de_cost_tokens >= 0 and abs(d.pe_cost_tokens - d.de_cost_tokens) <= tie_tokens


def agreement(a: Sequence[Decision], b: Sequence[Decision], tie_tokens: int = 0) -> Agreement:
    """Match by request name (a name decided twice keeps its last decision: a retried request).
    `tie_tokens` > 0 (one block, say) also measures `near_tie`."""
    da = {d.request: d for d in a}
    db = {d.request: d for d in b}
    common = sorted(da.keys() & db.keys())
    n = len(common)

    def frac(same) -> float:
        return sum(1 for r in common if same(da[r], db[r])) / n if n else float("nan")

    compared = [r for r in common if da[r].side != db[r].side and da[r].pe_cost_tokens >= 0 and db[r].pe_cost_tokens >= 0]
    near = (sum(near_tie(da[r], tie_tokens) or near_tie(db[r], tie_tokens) for r in compared) / len(compared)
            if compared and tie_tokens > 0 else float("nan"))
    return Agreement(n, len(da.keys() - db.keys()), len(db.keys() - da.keys()),
                     frac(lambda x, y: x.side == y.side), frac(lambda x, y: x.pe == y.pe),
                     frac(lambda x, y: x.de == y.de), frac(lambda x, y: x.hit_tokens == y.hit_tokens), near)


def decisions_path(base: str | Path, mode: str) -> Path:
    """Where `--decisions BASE` writes one mode's log: `out/d.jsonl` -> `out/d.<mode>.jsonl`."""
    base = Path(base)
    return base.with_name(f"{base.stem}.{mode}{base.suffix or '.jsonl'}")


def write_jsonl(decisions: Sequence[Decision], path: str | Path) -> Path:
    """One JSON object per line, in decision order (the module docstring's schema)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for d in decisions:
            f.write(json.dumps(asdict(d)) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[Decision]:
    from ..errors import InputError

    out = []
    for n, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(Decision(**json.loads(line)))
        except (ValueError, TypeError) as e:
            raise InputError(f"{path}:{n}: not a decision ({e})") from None
    return out
