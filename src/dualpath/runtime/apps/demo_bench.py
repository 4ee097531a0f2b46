"""`dualpath bench demo-robustness`: the demo quiet and beside CPU hogs, ratios side by side.

A result that matters must hold on a loaded machine. The rates are derived once, from this
machine's cached profile (`demo.plan_demo`), and kept for every run, as a user's would be; each run
is then a whole demo (both modes, one cluster) while `hogs` busy-loop processes (`yes > /dev/null`)
run from before the cluster starts until it stops. Reported per run: JCT of both modes and their
ratio, SNIC utilisation of both nodes while reads are queued, and the PE's busy seconds per turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .demo import DemoPlan, run_demo


@contextlib.contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """`n` processes that burn a CPU each (`yes` to /dev/null, or a Python loop without `yes`)."""
    cmd = ["yes"] if shutil.which("yes") else [sys.executable, "-c", "while True: pass"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.DEVNULL) for _ in range(n)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def summarise_demo(result: dict[str, Any]) -> dict[str, Any]:
    runs = {r["mode"]: r for r in result["runs"]}
    basic, dual = runs["basic"], runs["dualpath"]
    return {
        "jct_basic_s": basic["jct_s"], "jct_dualpath_s": dual["jct_s"], "ratio": dual["jct_s"] / basic["jct_s"],
        "snic_util_while_reading_dualpath": {e: v["utilisation_while_reading"] for e, v in dual["snic"].items()},
        "pe_busy_s_per_turn": {"basic": basic["pe_busy_s_per_turn"], "dualpath": dual["pe_busy_s_per_turn"]},
        "pe_busy_dualpath_over_basic": dual["pe_busy_s_per_turn"] / basic["pe_busy_s_per_turn"],
    }


def run_robustness(plan: DemoPlan, hogs: Sequence[int] = (0, 1, 2), model: str = "smollm2-135m", device: str = "cpu",
                   on_turn: Callable[[str, int, int, Any], None] | None = None) -> dict[str, Any]:
    rows = []
    for n in hogs:
        t0 = time.perf_counter()
        with cpu_hogs(n):
            result = asyncio.run(run_demo(model=model, device=device, plan=plan, on_turn=on_turn))
        rows.append({"hogs": n, **summarise_demo(result), "wall_s": time.perf_counter() - t0})
    last = result
    return {"config": last["config"], "profile": last["profile"], "workload": last["workload"], "runs": rows}


def plot_robustness(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["runs"]
    fig, ax = plt.subplots(figsize=(5, 3.2))
    xs = [f"{r['hogs']} hog{'s' if r['hogs'] != 1 else ''}" for r in rows]
    ax.bar(xs, [r["ratio"] for r in rows], color="#4c72b0")
    for x, r in zip(xs, rows):
        ax.annotate(f"{r['ratio']:.2f}", (x, r["ratio"]), ha="center", va="bottom")
    ax.axhline(0.60, color="gray", ls="--", lw=1, label="0.60 (quiet goal)")
    ax.axhline(0.65, color="gray", ls=":", lw=1, label="0.65 (one hog goal)")
    ax.axhline(0.50, color="black", lw=0.8, label="0.50 (two equal SNICs)")
    ax.set_ylim(0, 1.0)
    ax.set_ylabel("JCT dualpath / basic")
    rates = report["config"]["rates"]
    ax.set_title(f"demo robustness: SNIC {rates['snic_bytes_per_s'] / 1e6:.1f} MB/s ({rates['source']})", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
