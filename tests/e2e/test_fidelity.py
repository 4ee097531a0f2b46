"""`dualpath fidelity` on the tiny model and workload: the report's structure, errors computed from
the two runs (recomputed here from the values the report holds), decision logs of both worlds,
and bad input."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from dualpath.fidelity.compare import GOALS
from dualpath.metrics.decisions import Decision, agreement


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dualpath.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("fid") / "f.json"
    p = _cli("fidelity", "--workload", "tiny", "--model", "tiny", "--repeat", "2", "--mode", "basic", "--mode", "dualpath",
             "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(out.read_text())


def test_report_structure_and_errors_come_from_the_runs(report):
    assert set(report["modes"]) == {"basic", "dualpath"}
    for mode, r in report["modes"].items():
        for name, m in r["metrics"].items():
            if name == "snic_utilisation":
                continue
            assert len(m["runtime_runs"]) == 2
            mean = sum(m["runtime_runs"]) / 2
            assert m["runtime_mean"] == pytest.approx(mean)
            err = m["rel_error"]  # JSON null: infinite (the runtime's value is 0, the simulator's not)
            if mean:
                assert err == pytest.approx(m["sim"] / mean - 1)
            else:
                assert (err is None) == (m["sim"] != 0)
            if name in GOALS:
                assert m["met"] == (err is not None and abs(err) <= GOALS[name])
        logs = r["decision_logs"]
        sim = [Decision(**d) for d in logs["sim"]]
        real = [[Decision(**d) for d in log] for log in logs["runtime"]]
        assert len(sim) == report["num_turns"] and all(len(log) == report["num_turns"] for log in real)
        assert r["decisions"]["vs_sim"][0]["same_side"] == agreement(real[0], sim).same_side
        assert not math.isnan(r["metrics"]["jct_s"]["sim"])


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, needle in ((("--workload", "nope"), "unknown workload"), (("--repeat", "0"), "--repeat")):
        p = _cli("fidelity", "--model", "tiny", *args, timeout=300)
        assert p.returncode == 2, p.stderr[-2000:]
        assert needle in p.stderr and "Traceback" not in p.stderr


def test_workloads_fit_the_window_and_a_trace_is_refused(tmp_path):
    from dualpath.core.request import TurnSpec
    from dualpath.errors import InputError
    from dualpath.fidelity.run import workload_trajectories
    from dualpath.workloads import Trajectory, write_trajectories

    agents = workload_trajectories("agents", 2048, None)
    assert len(agents) == 8 and max(t.total_tokens for t in agents) <= 2048
    f = tmp_path / "t.jsonl"
    write_trajectories(f, [Trajectory(0, (TurnSpec(1000, 5), TurnSpec(1000, 5), TurnSpec(100, 5)))])
    (got,) = workload_trajectories(str(f), 2048, None)
    assert got.num_turns == 1 and got.total_tokens == 1005  # the second turn would end at 2010 > 2048 - 64
    trace = tmp_path / "m.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [1]}\n')
    with pytest.raises(InputError, match="Mooncake"):
        workload_trajectories(str(trace), 2048, None)
