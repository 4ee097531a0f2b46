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
