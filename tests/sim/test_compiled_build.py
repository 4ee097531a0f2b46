"""The optional mypyc build (`make compiled`, src/dualpath/_build.py): the freshness guard, and
that the compiled simulator produces exactly the pure-Python numbers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

from dualpath import _build

SUFFIX = EXTENSION_SUFFIXES[0]


def _fake_package(tmp_path: Path) -> Path:
    pkg = tmp_path / "dualpath"
    (pkg / "sim").mkdir(parents=True)
    (pkg / "sim" / "links.py").write_text("x = 1\n")
    return pkg


def test_pure_tree_passes_the_guard(tmp_path):
    _build.check_fresh(_fake_package(tmp_path))  # no extension modules: nothing to check


def test_guard_refuses_extensions_without_a_stamp(tmp_path):
    pkg = _fake_package(tmp_path)
    (pkg / "sim" / f"links{SUFFIX}").write_bytes(b"")
    with pytest.raises(_build.StaleBuildError, match="without a build stamp"):
        _build.check_fresh(pkg)


def test_guard_names_the_source_that_changed_since_the_build(tmp_path):
    pkg = _fake_package(tmp_path)
    (pkg / "sim" / f"links{SUFFIX}").write_bytes(b"")
    digest = _build.source_digest("dualpath/sim/links.py", pkg)
    (pkg / "_compiled.json").write_text(json.dumps({"sources": {"dualpath/sim/links.py": digest}}))
    _build.check_fresh(pkg)  # current: accepted
    (pkg / "sim" / "links.py").write_text("x = 2\n")
    with pytest.raises(_build.StaleBuildError, match=r"dualpath/sim/links\.py changed"):
        _build.check_fresh(pkg)


def test_compiled_module_list_names_real_sources():
    for rel in _build.COMPILED_MODULES:
        assert (_build.PACKAGE_DIR.parent / rel).is_file(), rel


_VOLATILE = {"wall_s", "turns_per_wall_s", "policy_wall_s", "build", "cpu_s_per_decision", "decisions_per_s"}
REPO = Path(__file__).resolve().parents[2]
MODES = ["basic", "dualpath", "oracle", "basic+layerwise+de_read"]
SIM = ("from dualpath.config import SimConfig, WorkloadConfig, paper_cluster; "
       "from dualpath.sim.runner import run_modes, write_json; "
       "cfg = SimConfig(cluster=paper_cluster('ds-v3.2-660b', '2P4D'), "
       "workload=WorkloadConfig(max_len_tokens=32 * 1024, num_agents=96, seed=5)); "
       f"write_json(run_modes(cfg, {MODES!r}), 'out.json')")


def _numbers(o):
    if isinstance(o, dict):
        return {k: _numbers(v) for k, v in o.items() if k not in _VOLATILE}
    if isinstance(o, list):
        return [_numbers(v) for v in o]
    return o


def _run_sim(src: Path) -> dict:
    """One small simulation of every mode family, in a subprocess importing `dualpath` from `src`."""
    env = {**os.environ, "PYTHONPATH": str(src)}
    subprocess.run([sys.executable, "-c", SIM], check=True, env=env, cwd=src)
    return json.loads((src / "out.json").read_text())


def _copy_sources(dst: Path) -> Path:
    shutil.copytree(_build.PACKAGE_DIR, dst / "dualpath",
                    ignore=shutil.ignore_patterns("*" + SUFFIX, "_compiled.json", "__pycache__"))
    return dst


def test_compiled_build_reproduces_pure_python_exactly(tmp_path):
    """`tools/compile_sim.py` on a copy of the sources, then the same workload on both builds:
    every number of the result JSON is equal (all but wall times and the build's name)."""
    pure_src = _copy_sources(tmp_path / "pure")
    compiled_src = _copy_sources(tmp_path / "compiled")
    subprocess.run([sys.executable, str(REPO / "tools" / "compile_sim.py"), "--src", str(compiled_src), "--opt-level", "0"],
                   check=True, capture_output=True)
    assert len(_build.extension_files(compiled_src / "dualpath")) == len(_build.COMPILED_MODULES) + 1  # + shared lib
    pure, compiled = _run_sim(pure_src), _run_sim(compiled_src)
    assert {r["build"] for r in pure["runs"]} == {"pure"}
    assert {r["build"] for r in compiled["runs"]} == {"compiled"}
    assert all(r["num_turns"] > 0 for r in pure["runs"])
    assert _numbers(compiled) == _numbers(pure)
