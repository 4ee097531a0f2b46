"""Layering: core imports nothing else of dualpath; runtime and sim never import each other."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dualpath"


def imported_packages(pkg: str) -> set[str]:
    found: set[str] = set()
    for path in (SRC / pkg).rglob("*.py"):
        rel_parts = path.relative_to(SRC).parts
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:  # relative: resolve against the module's package
                    base = list(rel_parts[:-1])[: len(rel_parts) - node.level]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = (node.module or "").removeprefix("dualpath.") if (node.module or "").startswith("dualpath") else ""
                if mod:
                    found.add(mod.split(".")[0])
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("dualpath."):
                        found.add(a.name.split(".")[1])
    return found


def test_core_imports_only_core():
    assert imported_packages("core") <= {"core"}


def test_runtime_and_sim_never_import_each_other():
    assert "sim" not in imported_packages("runtime")
    assert "runtime" not in imported_packages("sim")


def imported_modules(pkg: str, skip: tuple[str, ...] = ()) -> set[str]:
    """Every dualpath module (dotted, without `dualpath.`) imported by the files of `pkg` (but `skip`)."""
    found: set[str] = set()
    for path in (SRC / pkg).rglob("*.py"):
        if path.name in skip:
            continue
        rel_parts = path.relative_to(SRC).parts
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = list(rel_parts[:-1])[: len(rel_parts) - node.level]
                    found.add(".".join(base + ([node.module] if node.module else [])))
                elif (node.module or "").startswith("dualpath."):
                    found.add(node.module.removeprefix("dualpath."))
    return found


def rooms(pkg: str, skip: tuple[str, ...] = ()) -> set[str]:
    """The runtime rooms and top-level runtime modules that `pkg` imports (itself excluded)."""
    out = {".".join(m.split(".")[:2]) for m in imported_modules(pkg, skip) if m.startswith("runtime.")}
    return out - {pkg.replace("/", ".")}


def test_runtime_rooms_import_only_downwards():
    # engine/ and router/ never import each other or server/; server/ knows only api.py of the
    # runtime (its test double borrows the tiny model's tokenizer); nothing imports apps/
    # (docs/structure.md)
    assert not rooms("runtime/engine") & {"runtime.router", "runtime.server", "runtime.apps", "runtime.cluster"}
    assert not rooms("runtime/router") & {"runtime.engine", "runtime.server", "runtime.apps", "runtime.cluster"}
    assert rooms("runtime/server", skip=("fake_backend.py",)) <= {"runtime.api"}
    for pkg in ("runtime/engine", "runtime/router", "runtime/server", "runtime/model", "runtime/store", "runtime/transport"):
        assert "runtime.apps" not in rooms(pkg), pkg
