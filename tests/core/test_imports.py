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


def test_runtime_ground_floor_imports_nothing_above_it():
    # clock, model, store and transport import nothing of the runtime above them (docs/structure.md's layering)
    assert rooms("runtime/model") == set()
    assert rooms("runtime/store") <= {"runtime.clock"}
    assert rooms("runtime/transport") <= {"runtime.clock"}


HARNESSES = ("deploy", "chaos", "bench", "experiments", "cli")  # the wings around the two worlds


def test_the_worlds_never_import_the_harnesses():
    # core/, sim/ and runtime/ are what the two worlds run; the testbed, Ray, chaos, benchmarks,
    # the paper's experiments and the CLI stand around them (docs/structure.md)
    for pkg in ("core", "sim", "runtime"):
        for path in (SRC / pkg).rglob("*.py"):
            assert not {m for m in _module_imports(path) if m.split(".")[0] in HARNESSES}, path


def test_nothing_imports_apps_bench_or_cli():
    # cli/ stands above everything; bench/, fidelity/, plan/ and docs/ above both worlds (they may
    # import one another); runtime/apps/ above the runtime's rooms, imported only by the wings above
    above_both = {"bench", "fidelity", "plan", "docs"}
    above_apps = {"chaos", "deploy", *above_both}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC).parts
        mods = _module_imports(path)
        if parts[0] != "cli":
            assert not {m for m in mods if m.split(".")[0] == "cli"}, path
            if parts[0] not in above_both:
                assert not {m for m in mods if m.split(".")[0] in above_both}, path
                if parts[:2] != ("runtime", "apps") and parts[0] not in above_apps:
                    assert not {m for m in mods if m.startswith("runtime.apps")}, path


def test_simulator_components_never_import_the_simulator():
    # only runner.py builds a Simulator; the components get a SimContext and the TurnLifecycle
    for path in (SRC / "sim").glob("*.py"):
        if path.name not in ("simulator.py", "runner.py"):
            assert "sim.simulator" not in _module_imports(path), path.name


# --- no import cycle anywhere (type-only imports count) ------------------------------------------

def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def _module_imports(path: Path, root: Path = SRC) -> set[str]:
    """Dotted dualpath modules (without `dualpath.`) that one file imports, at any depth of the file
    (under `if TYPE_CHECKING:` too); `from . import x` counts as the package and its module x."""
    me = _module_name(path, root).split(".")
    pkg = me if path.name == "__init__.py" else me[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        out.update(n.removeprefix("dualpath.") for n in names if n == "dualpath" or n.startswith("dualpath."))
    return out


def import_cycles(root: Path = SRC) -> list[list[str]]:
    """Strongly connected components of the module import graph under `root` (a dualpath source
    tree), but those that exist only through a package's __init__ importing its own children."""
    files = {_module_name(p, root).removeprefix("dualpath."): p for p in root.rglob("*.py")}
    graph = {m: {t for t in _module_imports(p, root) if t in files and t != m} for m, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            inits = [m for m in comp if files[m].name == "__init__.py"]
            only_inits = inits and all(len(set(comp) - {i}) <= 1 for i in inits)
            if len(comp) > 1 and not only_inits:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_in_any_package():
    assert import_cycles() == []


def test_a_deliberate_cycle_is_found(tmp_path):
    import shutil

    tree = tmp_path / "dualpath"
    shutil.copytree(SRC, tree, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    assert import_cycles(tree) == []
    # a type-only import back from a component to the simulator: the cycle lifecycle.py exists to avoid
    reads = tree / "sim" / "reads.py"
    reads.write_text(reads.read_text() + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                           "    from .simulator import Simulator\n")
    cycles = import_cycles(tree)
    assert len(cycles) == 1 and {"sim.reads", "sim.simulator"} <= set(cycles[0])
