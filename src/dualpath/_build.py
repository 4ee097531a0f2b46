"""Which build of the simulator's hot path runs: compiled with mypyc, or pure Python.

`tools/compile_sim.py` compiles `COMPILED_MODULES` with mypyc into extension modules beside their
sources; the set-up (`make demo`, `make test`) runs it when a C compiler is present, `make compiled`
runs it on demand and `make clean-compiled` removes it. Python imports an extension module before a
`.py` of the same name, so the same source then runs as C: same arithmetic, same event order, the
same numbers (checked by tests/sim/test_compiled_build.py), about three and a half times faster
(docs/results/sim_speed.json, both builds side by side). The pure-Python build is the reference.

A stamp (`_compiled.json`, written by the build) records each compiled source's SHA-256.
`choose_build()` runs when `dualpath` is imported. It keeps the compiled build only when every
compiled source is unchanged since the build; otherwise (or with `DUALPATH_BUILD=pure` in the
environment) it puts a finder ahead of Python's that loads those modules from their sources, so an
edit is never shadowed by stale machine code, and `build_note()` says why. All of them or none run
compiled: mypyc's modules call each other natively.

This module is never compiled and imports nothing from the package.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.util
import json
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from pathlib import Path
from typing import Mapping, Optional, Sequence

PACKAGE_DIR = Path(__file__).resolve().parent
STAMP_PATH = PACKAGE_DIR / "_compiled.json"
GROUP_NAME = "dualpath.simc"  # the mypyc shared library: dualpath/simc__mypyc.<suffix>
BUILD_ENV = "DUALPATH_BUILD"  # "pure": run the sources even where a fresh compiled build exists

# The simulator's event loop, links, engine groups and the policies they call per decision:
# what a 48P96D run spends its time in (py-spy of `dualpath sim` at 48P96D); and the modules a
# compiled run still called into as Python on every turn (cProfile of a compiled run: the turn
# recorder, phase checks, request ids; the EP traffic, persists and DRAM tiers, 40% of a 2P4D
# run's time before they joined); and the timeline, whose null recorder every component calls
# while nothing is recorded (metrics/timeline.py).
COMPILED_MODULES = (
    "dualpath/costmodel/cost.py",
    "dualpath/core/dram.py",
    "dualpath/core/phase.py",
    "dualpath/core/record.py",
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
    "dualpath/sim/dram.py",
    "dualpath/sim/ep_comm.py",
    "dualpath/sim/events.py",
    "dualpath/sim/hits.py",
    "dualpath/sim/kv_io.py",
    "dualpath/sim/lifecycle.py",
    "dualpath/sim/links.py",
    "dualpath/sim/persists.py",
    "dualpath/sim/prefill.py",
    "dualpath/sim/reads.py",
    "dualpath/sim/dispatch.py",
    "dualpath/sim/simulator.py",
    "dualpath/sim/state.py",
)

_note = "pure Python (no compiled build: `make compiled` builds one where a C compiler is present)"


def source_digest(rel_path: str, package_dir: Path = PACKAGE_DIR) -> str:
    return hashlib.sha256((package_dir.parent / rel_path).read_bytes()).hexdigest()


def extension_files(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """Extension modules inside the package (ours are only ever the compiled ones)."""
    return sorted(p for p in package_dir.rglob("*") if any(p.name.endswith(s) for s in EXTENSION_SUFFIXES))


def build_kind() -> str:
    """'compiled' when the simulator module Python imported is a compiled one, else 'pure'.
    Reported in every simulation result, since it changes wall times only."""
    mod = sys.modules.get("dualpath.sim.simulator")
    origin = getattr(mod, "__file__", None) or ""
    return "compiled" if any(origin.endswith(s) for s in EXTENSION_SUFFIXES) else "pure"


def stale_reason(package_dir: Path = PACKAGE_DIR) -> Optional[str]:
    """Why the compiled modules in `package_dir` must not run; None when they may (or there are none)."""
    exts = extension_files(package_dir)
    if not exts:
        return None
    stamp_path = package_dir / STAMP_PATH.name
    if not stamp_path.exists():
        return f"compiled modules without a build stamp ({exts[0].name}, ...)"
    built = json.loads(stamp_path.read_text())["sources"]
    changed = [m for m, digest in built.items()
               if not (package_dir.parent / m).is_file() or source_digest(m, package_dir) != digest]
    if changed:
        return f"the compiled build is stale: {', '.join(changed)} changed since it was built"
    missing = [m for m in COMPILED_MODULES if m not in built]
    if missing:
        return f"the compiled build lacks {', '.join(missing)}"
    return None


class SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the named modules from their `.py` sources, ahead of the extension modules beside them."""

    def __init__(self, sources: Mapping[str, Path]) -> None:
        self.sources = dict(sources)

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: object = None) -> Optional[ModuleSpec]:
        source = self.sources.get(fullname)
        return None if source is None else importlib.util.spec_from_file_location(fullname, source)


def module_sources(package_dir: Path = PACKAGE_DIR) -> dict[str, Path]:
    """Each compiled module's dotted name and its source."""
    return {rel[:-3].replace("/", "."): package_dir.parent / rel for rel in COMPILED_MODULES}


def choose_build(package_dir: Path = PACKAGE_DIR, environ: Mapping[str, str] = os.environ) -> str:
    """Keep the compiled build where it is fresh and wanted, else load the sources (a `SourceFinder`
    first on sys.meta_path). Returns the line `build_note()` gives from now on."""
    global _note
    if not extension_files(package_dir):
        return _note
    wanted = environ.get(BUILD_ENV, "")
    reason: Optional[str]
    if wanted == "pure":
        reason = f"{BUILD_ENV}=pure"
    elif wanted in ("", "compiled"):
        reason = stale_reason(package_dir)
        if reason is not None:
            reason += "; `make compiled` rebuilds it"
    else:
        reason = f"{BUILD_ENV}={wanted!r} is neither pure nor compiled"
    if reason is None:
        _note = "compiled (mypyc)"
        return _note
    if not any(isinstance(f, SourceFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, SourceFinder(module_sources(package_dir)))
    _note = f"pure Python ({reason})"
    return _note


def build_note() -> str:
    """Which build runs and, if pure, why."""
    return _note


def build_line() -> str:
    """What a command that simulates says before it starts (cli/io.py `say_build`, `repro`)."""
    return f"simulator: {_note}"
