"""What the rechecks of experiments/beyond.py and experiments/selective.py share in their tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from dualpath.experiments.common import Context


def recheck_first_failing(tmp_path: Path, num_points: int, passed_key: str,
                          recheck: Callable[[Context, list[dict[str, Any]]], None]) -> dict[str, Any]:
    """`recheck` at quick scale on a table whose first point alone failed its goal (`passed_key`
    false): no other point is run again, the first is, on seeds 2 to 5. Returns its recheck."""
    table = [{"goal": {passed_key: i != 0}} for i in range(num_points)]
    recheck(Context(tmp_path, scale="quick", seed=1), table)
    assert all("recheck" not in r for r in table[1:])
    got = table[0]["recheck"]
    assert got["seeds"] == [2, 3, 4, 5]
    return got
