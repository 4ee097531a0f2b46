"""A sweep's outputs: OUT/sweep.csv and OUT/sweep.json (one row per grid point, run.COLUMNS),
OUT/sweep.png (JCT against agents, a line per model / P/D / MaxLen / mode / tool time, the mean over seeds)."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path
from typing import Any, Sequence

from ..sim.runner import write_json
from .run import COLUMNS


def write_table(rows: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv_path, json_path = out_dir / "sweep.csv", out_dir / "sweep.json"
    with csv_path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows({k: ("" if _missing(r[k]) else r[k]) for k in COLUMNS} for r in rows)
    write_json({"columns": list(COLUMNS), "rows": list(rows)}, json_path)
    return [csv_path, json_path]


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def plot(rows: Sequence[dict[str, Any]], path: Path) -> Path:
    from ..experiments.common import pyplot

    plt = pyplot()
    lines: dict[tuple, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        if not _missing(r["jct_s"]):
            lines[(r["model"], r["pd"], r["max_len_tokens"], r["mode"], r.get("tool_time_s", 0.0))][r["agents"]].append(r["jct_s"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for (model, pd, max_len, mode, tool_s), by_agents in sorted(lines.items()):
        xs = sorted(by_agents)
        tool = f" tool {tool_s:g} s" if tool_s else ""
        ax.plot(xs, [sum(by_agents[x]) / len(by_agents[x]) for x in xs], "-o", ms=3,
                label=f"{model} {pd} {max_len // 1024}K {mode}{tool}")
    ax.set_xlabel("agents")
    ax.set_ylabel("JCT s (mean over seeds)")
    ax.set_title("dualpath sweep")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
