"""Which build of the simulator's hot path is running: pure Python, or compiled with mypyc.

`make compiled` (tools/compile_sim.py) compiles `COMPILED_MODULES` with mypyc into extension
modules beside their sources. Python imports an extension module before a `.py` of the same name,
so the same source then runs as C: same arithmetic, same event order, the same numbers (checked by
tests/sim/test_compiled_build.py), faster (docs/results/sim_speed_compiled.json against
sim_speed.json). `make clean-compiled` removes them. The pure-Python build is the default and the reference.

A stamp (`_compiled.json`, written by the build) records each compiled source's SHA-256.
`check_fresh()` runs when `dualpath` is imported and refuses extension modules whose source has
changed since they were built, so an edit is never silently shadowed by stale machine code.

This module is never compiled and imports nothing from the package.
"""

from __future__ import annotations

import hashlib
import json
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
STAMP_PATH = PACKAGE_DIR / "_compiled.json"
GROUP_NAME = "dualpath.simc"  # the mypyc shared library: dualpath/simc__mypyc.<suffix>

# The simulator's event loop, links, engine groups and the policies they call per decision:
# what a 48P96D run spends its time in (py-spy of `dualpath sim` at 48P96D); and the small
# modules a compiled run still called into as Python on every turn (cProfile of a compiled run:
# the turn recorder, phase checks, request ids, 9% of its time); and the timeline, whose null
# recorder every component calls while nothing is recorded (metrics/timeline.py).
COMPILED_MODULES = (
    "dualpath/costmodel/cost.py",
    "dualpath/core/phase.py",
    "dualpath/core/request.py",
    "dualpath/core/scheduler.py",
    "dualpath/core/snapshot.py",
    "dualpath/core/policy/batching.py",
    "dualpath/core/policy/decode.py",
    "dualpath/core/policy/prefill.py",
    "dualpath/core/policy/read_side.py",
    "dualpath/core/policy/round_robin.py",
    "dualpath/metrics/recorder.py",
    "dualpath/metrics/timeline.py",
    "dualpath/sim/compute.py",
    "dualpath/sim/compute_measured.py",
    "dualpath/sim/cpu_share.py",
    "dualpath/sim/decode.py",
    "dualpath/sim/events.py",
    "dualpath/sim/hits.py",
    "dualpath/sim/kv_io.py",
    "dualpath/sim/lifecycle.py",
    "dualpath/sim/links.py",
    "dualpath/sim/prefill.py",
    "dualpath/sim/reads.py",
    "dualpath/sim/dispatch.py",
    "dualpath/sim/simulator.py",
    "dualpath/sim/state.py",
)


class StaleBuildError(ImportError):
    pass


def source_digest(rel_path: str, package_dir: Path = PACKAGE_DIR) -> str:
    return hashlib.sha256((package_dir.parent / rel_path).read_bytes()).hexdigest()


def extension_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Extension modules inside the package (ours are only ever the compiled ones)."""
    return sorted(p for p in package_dir.rglob("*") if any(p.name.endswith(s) for s in EXTENSION_SUFFIXES))


def build_kind() -> str:
    """'compiled' when the simulator module Python imports is a compiled one, else 'pure'.
    Reported in every simulation result, since it changes wall times only."""
    mod = sys.modules.get("dualpath.sim.simulator")
    origin = getattr(mod, "__file__", None) or ""
    return "compiled" if any(origin.endswith(s) for s in EXTENSION_SUFFIXES) else "pure"


def check_fresh(package_dir: Path = PACKAGE_DIR) -> None:
    exts = extension_files(package_dir)
    if not exts:
        return
    fix = "run `make compiled` to rebuild or `make clean-compiled` to go back to pure Python"
    stamp_path = package_dir / STAMP_PATH.name
    if not stamp_path.exists():
        raise StaleBuildError(f"compiled modules without a build stamp ({exts[0].name}, ...): {fix}")
    stamp = json.loads(stamp_path.read_text())
    changed = [m for m, digest in stamp["sources"].items() if source_digest(m, package_dir) != digest]
    if changed:
        raise StaleBuildError(f"compiled modules are stale: {', '.join(changed)} changed since the build; {fix}")
