"""README.md's numbers: the demo's headline and the reproduction's count of headlines met."""

from __future__ import annotations

from ..fmt import mb, num, ratio, table
from ..registry import block
from ..results import Results
from .paper import REPRO
from .runtime import jct_ratio


@block("readme_demo", reads=("runtime/demo.json",),
       command="dualpath demo --json docs/results/runtime/demo.json --plot docs/results/runtime/demo.png")
def readme_demo(r: Results) -> str:
    d = r.json("runtime/demo.json")
    rows = [[m["mode"], num(m["jct_s"], 1), num(m["ttft_s"]["p50"], 2), mb(m["bytes"]["storage_to_prefill"], 0),
             mb(m["bytes"]["storage_via_decode"], 0)] for m in d["runs"]]
    return (table(["mode", "JCT s", "TTFT p50 s", "PE-path MB", "DE-path MB"], rows)
            + f"\n\nDualPath finishes the same workload in **{ratio(jct_ratio(d))}x** basic's time (JCT dualpath / basic).")


@block("readme_repro", reads=("repro/summary.json",), command=REPRO)
def readme_repro(r: Results) -> str:
    c = r.json("repro/summary.json")["counts"]
    return (f"The last full `dualpath repro` meets {c['independent_met']} of {c['independent']} independent "
            f"agreements with the paper ({c['met']} of {c['headlines']} headline targets, counting arithmetic checks and "
            f"headlines that share simulations); `docs/results.md` lists each with its error and the knobs behind it.")
