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

from dualpath import _build

SUFFIX = EXTENSION_SUFFIXES[0]


def _fake_package(tmp_path: Path) -> Path:
    pkg = tmp_path / "dualpath"
    (pkg / "sim").mkdir(parents=True)
    (pkg / "sim" / "links.py").write_text("x = 1\n")
    return pkg


def test_pure_tree_passes_the_guard(tmp_path):
    assert _build.stale_reason(_fake_package(tmp_path)) is None  # no extension modules: nothing to check


def test_guard_refuses_extensions_without_a_stamp(tmp_path):
    pkg = _fake_package(tmp_path)
    (pkg / "sim" / f"links{SUFFIX}").write_bytes(b"")
    assert "without a build stamp" in _build.stale_reason(pkg)


def test_guard_names_the_source_that_changed_since_the_build(tmp_path):
    pkg = _fake_package(tmp_path)
    (pkg / "sim" / f"links{SUFFIX}").write_bytes(b"")
    stamp = {"sources": {m: "0" * 64 for m in _build.COMPILED_MODULES}}
    stamp["sources"]["dualpath/sim/links.py"] = _build.source_digest("dualpath/sim/links.py", pkg)
    (pkg / "_compiled.json").write_text(json.dumps(stamp))
    for rel in _build.COMPILED_MODULES:  # every other listed source: present, with the digest stamped
        if rel != "dualpath/sim/links.py":
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text("")
            stamp["sources"][rel] = _build.source_digest(rel, pkg)
    (pkg / "_compiled.json").write_text(json.dumps(stamp))
    assert _build.stale_reason(pkg) is None  # current: accepted
    (pkg / "sim" / "links.py").write_text("x = 2\n")
    assert "dualpath/sim/links.py changed" in _build.stale_reason(pkg)
    (pkg / "sim" / "links.py").write_text("x = 1\n")
    del stamp["sources"]["dualpath/sim/dram.py"]  # a build older than the module list
    (pkg / "_compiled.json").write_text(json.dumps(stamp))
    assert "lacks dualpath/sim/dram.py" in _build.stale_reason(pkg)


def test_a_stale_build_loads_every_compiled_module_from_its_source(tmp_path, monkeypatch):
    """choose_build puts a finder first that maps each compiled module to its `.py`, and says why."""
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if not isinstance(f, _build.SourceFinder)])
    monkeypatch.setattr(_build, "_note", _build.build_note())
    pkg = _fake_package(tmp_path)
    (pkg / "sim" / f"links{SUFFIX}").write_bytes(b"")
    note = _build.choose_build(pkg, environ={})
    assert note.startswith("pure Python (compiled modules without a build stamp") and note == _build.build_note()
    finder = sys.meta_path[0]
    assert isinstance(finder, _build.SourceFinder)
    assert finder.find_spec("dualpath.sim.links").origin == str(pkg / "sim" / "links.py")
    assert finder.find_spec("dualpath.sim.runner") is None  # not compiled: Python's own finders
    assert set(finder.sources) == {m[:-3].replace("/", ".") for m in _build.COMPILED_MODULES}
    assert "neither pure nor compiled" in _build.choose_build(pkg, environ={_build.BUILD_ENV: "fast"})
    assert _build.choose_build(pkg, environ={_build.BUILD_ENV: "pure"}) == "pure Python (DUALPATH_BUILD=pure)"
    assert sum(isinstance(f, _build.SourceFinder) for f in sys.meta_path) == 1  # put there once


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


def _env(src: Path, **extra: str) -> dict[str, str]:
    """This environment, importing `dualpath` from `src`, the build chosen by `extra` alone."""
    return {**{k: v for k, v in os.environ.items() if k != _build.BUILD_ENV}, "PYTHONPATH": str(src), **extra}


def _run_sim(src: Path, **env_extra: str) -> dict:
    """One small simulation of every mode family, in a subprocess importing `dualpath` from `src`."""
    subprocess.run([sys.executable, "-c", SIM], check=True, env=_env(src, **env_extra), cwd=src)
    return json.loads((src / "out.json").read_text())


def _compiled_copy(dst: Path) -> Path:
    """A copy of the package with a compiled build: this tree's own where it is fresh (the set-up
    builds one where a C compiler is present), else one built here (opt level 0, faster to compile)."""
    fresh = _build.extension_files() and _build.stale_reason() is None
    ignore = ["__pycache__"] if fresh else ["*" + SUFFIX, "_compiled.json", "__pycache__"]
    shutil.copytree(_build.PACKAGE_DIR, dst / "dualpath", ignore=shutil.ignore_patterns(*ignore))
    if not fresh:
        subprocess.run([sys.executable, str(REPO / "tools" / "compile_sim.py"), "--src", str(dst), "--opt-level", "0"],
                       check=True, capture_output=True)
    return dst


def test_compiled_build_reproduces_pure_python_exactly(tmp_path):
    """A compiled copy of the sources, then the same workload on both builds: every number of the
    result JSON is equal (all but wall times and the build's name). Then the same copy with
    DUALPATH_BUILD=pure, and with a source edited after the build: the sources run, and say why."""
    compiled_src = _compiled_copy(tmp_path)
    assert len(_build.extension_files(compiled_src / "dualpath")) == len(_build.COMPILED_MODULES) + 1  # + shared lib
    pure, compiled = _run_sim(compiled_src, DUALPATH_BUILD="pure"), _run_sim(compiled_src)
    assert {r["build"] for r in pure["runs"]} == {"pure"}
    assert {r["build"] for r in compiled["runs"]} == {"compiled"}
    assert all(r["num_turns"] > 0 for r in pure["runs"])
    assert _numbers(compiled) == _numbers(pure)
    links = compiled_src / "dualpath" / "sim" / "links.py"
    links.write_text(links.read_text() + "\n# edited after the build\n")
    edited = _run_sim(compiled_src)
    assert {r["build"] for r in edited["runs"]} == {"pure"} and _numbers(edited) == _numbers(pure)
    said = subprocess.run([sys.executable, "-m", "dualpath.cli", "sim", "--agents", "2", "--mode", "basic", "--quiet"],
                          env=_env(compiled_src), cwd=compiled_src, capture_output=True, text=True)
    assert said.returncode == 0, said.stderr
    assert said.stderr.startswith("simulator: pure Python (the compiled build is stale: dualpath/sim/links.py changed")
