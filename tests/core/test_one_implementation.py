"""Written once: the scheduling pass, alpha/beta, the PE batch budgets, the turn latencies and the
Prometheus writer each live in one module, which both worlds call, so the two cannot drift apart. These checks
read the code's AST, so a second copy fails them wherever it is added."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "dualpath"


def _modules() -> dict[str, ast.AST]:
    return {str(p.relative_to(SRC)): ast.parse(p.read_text()) for p in SRC.rglob("*.py")}


def _callers(names: set[str]) -> dict[str, set[str]]:
    """name -> the modules that call it (as `name(...)` or `x.name(...)`)."""
    out: dict[str, set[str]] = {n: set() for n in names}
    for rel, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
                if name in out:
                    out[name].add(rel)
    return out


def test_only_the_global_scheduler_runs_the_policies():
    policies = {"select_prefill", "select_decode", "choose_read_side", "distribute_to_groups",
                "round_robin_prefill", "round_robin_decode", "round_robin_read_side", "split_read"}
    for name, where in _callers(policies).items():
        assert where == {"core/scheduler.py"}, f"{name} is called from {sorted(where)}"


def test_one_threshold_derivation_and_one_budget_rule():
    calls = _callers({"PrefillThresholds", "derive_thresholds", "prefill_budgets", "Budget"})
    assert calls["PrefillThresholds"] == {"core/scheduler.py"}
    assert calls["derive_thresholds"] == {"sim/simulator.py", "runtime/router/state.py"}
    assert calls["prefill_budgets"] == {"sim/prefill.py", "runtime/engine/prefill.py"}
    # outside the rule, an engine only names its own memory budget (PE HBM or landing zone)
    assert calls["Budget"] == {"core/policy/batching.py", "sim/prefill.py", "runtime/engine/prefill.py"}


def _dict_keys_built(key: str) -> set[str]:
    """Modules with a dict literal that computes `key` (a call as its value)."""
    out = set()
    for rel, tree in _modules().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Dict):
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and k.value == key and isinstance(v, ast.Call):
                        out.add(rel)
    return out


def test_one_definition_of_the_turn_latencies():
    for key in ("ttft_s", "ttst_s", "tpot_s"):
        assert _dict_keys_built(key) == {"metrics/summary.py"}, key
    assert _callers({"turn_latencies"})["turn_latencies"] == {
        "sim/results.py", "runtime/router/metrics.py", "runtime/apps/replay.py"}


def test_one_prometheus_writer():
    writers = {rel for rel, tree in _modules().items() for node in ast.walk(tree)
               if isinstance(node, ast.Constant) and isinstance(node.value, str) and "# TYPE" in node.value}
    assert writers <= {"metrics/prometheus.py"}, sorted(writers)


def _attribute_reads(attr: str, package: str) -> dict[str, int]:
    """module -> how many times it reads `x.<attr>` (package: a folder under src/dualpath)."""
    out: dict[str, int] = {}
    for rel, tree in _modules().items():
        if rel.startswith(package + "/"):
            n = sum(1 for node in ast.walk(tree) if isinstance(node, ast.Attribute) and node.attr == attr)
            if n:
                out[rel] = n
    return out


def test_the_simulator_picks_its_mode_strategies_once():
    """The oracle is a free network (sim/kv_io.py) and a compute-only pipeline (sim/prefill.py),
    chosen in constructors: no mechanism asks `features.io_free` or `layerwise_prefill` per event."""
    assert _attribute_reads("io_free", "sim") == {"sim/simulator.py": 1, "sim/prefill.py": 1}
    assert _attribute_reads("layerwise_prefill", "sim") == {"sim/prefill.py": 2}  # the HBM budget, the pipeline
    # Dispatch's constructor (the SplitRule) and the results' count
    assert _attribute_reads("split_reads", "sim") == {"sim/dispatch.py": 1, "sim/results.py": 1}
    calls = _callers({"kv_io_for", "pipeline_for"})
    assert calls == {"kv_io_for": {"sim/simulator.py"}, "pipeline_for": {"sim/prefill.py"}}


# How the simulator resembles the runtime (ClusterConfig, the `local` preset) is chosen where a
# component is built; `_build_topology` builds the links for the Simulator's constructor.
LIKENESS_FLAGS = ("cnic_as_runtime_arbiter", "buffers_at_placement", "decode_waits_for_step_end",
                  "persist_waits_for_snic_write")
CONSTRUCTION = ("__init__", "_build_topology")


def test_the_simulators_runtime_likeness_is_read_only_in_constructors():
    found = []
    for rel, tree in _modules().items():
        if not rel.startswith("sim/"):
            continue
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef) and fn.name not in CONSTRUCTION:
                found += [f"{rel}:{node.lineno} {fn.name} reads {node.attr}" for node in ast.walk(fn)
                          if isinstance(node, ast.Attribute) and node.attr in LIKENESS_FLAGS]
    assert not found, found
