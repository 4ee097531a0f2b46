"""`dualpath fidelity` on the tiny model and workload: the report's structure, errors computed from
the two runs (recomputed here from the values the report holds), decision logs of both worlds,
and bad input."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from cli_helpers import cli as _cli, cli_here

from dualpath.fidelity.compare import GOALS
from dualpath.metrics.decisions import Decision, agreement




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
        placed = r["placed_hits"]  # per request, both worlds: the hit placement fixed
        names = {d.request for d in sim}
        assert set(placed["sim"]) == names and all(set(p) == names for p in placed["runtime"])
        assert r["metrics"]["placed_hit_tokens"]["sim"] == sum(placed["sim"].values())
        assert r["metrics"]["placed_hit_tokens"]["runtime_runs"] == [sum(p.values()) for p in placed["runtime"]]
        assert any(placed["sim"].values()) and any(placed["runtime"][0].values())  # later turns hit
        assert not math.isnan(r["metrics"]["jct_s"]["sim"])
        shared = r["sim_shared_cnics"]  # the ablation's errors against the same runtime means
        assert set(shared) == set(r["metrics"]) - {"snic_utilisation"}
        for name, alt in shared.items():
            mean = r["metrics"][name]["runtime_mean"]
            if mean:
                assert alt["rel_error"] == pytest.approx(alt["sim"] / mean - 1)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    too_long = tmp_path / "long.jsonl"  # a first round beyond the tiny model's 4,096-token window
    too_long.write_text('{"agent": 0, "rounds": [[10000, 3], [40, 3]]}\n')
    lone = tmp_path / "lone.jsonl"  # a Mooncake trace without a conversation of two turns
    lone.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 2, "hash_ids": [0, 1]}\n')
    for args, needle in ((("--workload", "nope"), "unknown workload"), (("--repeat", "0"), "--repeat"),
                         (("--workload", str(too_long)), "smaller than the first round"),
                         (("--workload", str(lone)), "no conversation of two or more turns")):
        p = cli_here("fidelity", "--model", "tiny", *args)
        assert p.returncode == 2, p.stderr[-2000:]
        assert needle in p.stderr and "Traceback" not in p.stderr


def test_workloads_fit_the_window(tmp_path):
    from dualpath.core.request import TurnSpec
    from dualpath.fidelity.workloads import fidelity_workload
    from dualpath.workloads import Trajectory, write_trajectories

    agents = fidelity_workload("agents", 2048, None, 64)
    assert len(agents) == 8 and max(t.total_tokens for t in agents) <= 2048
    f = tmp_path / "t.jsonl"
    write_trajectories(f, [Trajectory(0, (TurnSpec(1000, 5), TurnSpec(1000, 5), TurnSpec(100, 5)))])
    (got,) = fidelity_workload(str(f), 2048, None, 64)
    assert got.num_turns == 1 and got.total_tokens == 1005  # the second turn would end at 2010 > 2048 - 64


def _conversation_trace(path):
    """Conversation c (c = 0..9) has 3 turns 100 s apart; its prompt grows by a block a turn;
    conversation 3's are too long for a 2,048-token window once rescaled (40 blocks of 64)."""
    lines = []
    for c in range(10):
        blocks = 40 if c == 3 else 2
        for turn in range(3):
            ids = [0] + [1000 * c + j for j in range(blocks + turn)]
            lines.append({"timestamp": 1000 * (100 * turn + c), "input_length": 512 * len(ids) - 200,
                          "output_length": 256, "hash_ids": ids})
    lines.sort(key=lambda o: o["timestamp"])
    path.write_text("".join(json.dumps(o) + "\n" for o in lines))
    return path


def test_a_mooncake_trace_is_sliced_rescaled_and_replayed_in_both_worlds_alike(tmp_path):
    from dualpath.fidelity.run import _replan, _sim_workload
    from dualpath.fidelity.workloads import SLICE_CONVERSATIONS, fidelity_workload, trace_turn_costs

    work = fidelity_workload(str(_conversation_trace(tmp_path / "m.jsonl")), 8192, None, 64)
    convs = [c for c in range(10) if c != 3][:SLICE_CONVERSATIONS]
    assert [r.block_ids[1] // 1000 for r in work.records] == [c for turn in range(3) for c in convs]
    assert all(r.block_tokens == 64 and r.input_tokens == 64 * len(r.block_ids) - 25 and r.output_tokens == 32
               for r in work.records)
    costs = trace_turn_costs(work.records, 64)
    # the first turn hits the shared first block, except the very first request; later turns their context
    assert [c.hit_tokens for c in costs[:2]] == [0, 64]
    assert all(c.hit_tokens == 64 * (len(r.block_ids) - 2) for c, r in zip(costs[len(convs):], work.records[len(convs):]))

    plan = _replan(_Plan(None, None, _Calibration(_FlatProfile())), work, 1000, 64)
    span_s = work.records[-1].timestamp_s - work.records[0].timestamp_s
    assert plan.trajectories.time_scale * span_s == pytest.approx(plan.rates.predicted_basic_jct_s)
    agents, arrivals = _sim_workload(plan.trajectories)
    assert len(agents) == len(work.records) and arrivals == sorted(arrivals)
    assert arrivals[-1] == pytest.approx(plan.rates.predicted_basic_jct_s)


@dataclasses.dataclass(frozen=True)
class _Plan:  # what _replan reads and replaces of a DemoPlan
    trajectories: object
    rates: object
    calibration: object


@dataclasses.dataclass(frozen=True)
class _Calibration:
    profile: object


class _FlatProfile:
    def prefill_s(self, new_tokens: int, context_tokens: int) -> float:
        return 1e-4 * new_tokens


def test_decision_logs_round_trip_as_jsonl_and_a_bad_line_is_named(tmp_path):
    from dualpath.errors import InputError
    from dualpath.metrics.decisions import DecisionLog, decisions_path, read_jsonl, write_jsonl

    log = DecisionLog(t0_s=10.0)
    log.record("a0t0", 10.5, 0, 1, 1, 128)
    log.record("a1t0", 11.0, 1, 0, 0, 0)
    path = decisions_path(tmp_path / "out" / "d.jsonl", "basic+layerwise")
    assert path == tmp_path / "out" / "d.basic+layerwise.jsonl"
    write_jsonl(log.decisions, path)
    assert read_jsonl(path) == [Decision("a0t0", 0.5, 0, 1, "decode", 128), Decision("a1t0", 1.0, 1, 0, "prefill", 0)]
    assert json.loads(path.read_text().splitlines()[0]) == {"request": "a0t0", "t_s": 0.5, "pe": 0, "de": 1,
                                                            "side": "decode", "hit_tokens": 128}
    path.write_text(path.read_text() + '{"request": "x"}\n')
    with pytest.raises(InputError, match=r"d.basic\+layerwise.jsonl:3"):
        read_jsonl(path)


def test_the_simulator_runs_at_the_speed_the_runs_measured_from_their_forwards(report):
    """in_run_speed: the runs' model time over the start profile's prediction for the same
    forwards (fidelity/speed.py), recomputed from the report; the start-speed ablation's errors
    come from the same runtime means."""
    m = report["local_preset"]  # the profile at the speed checked before the runs
    fits = {"prefill": (m["prefill_fixed_s"], m["prefill_per_token_s"], 0.0, m["prefill_per_key_s"]),
            "decode": (m["decode_fixed_s"], m["decode_per_seq_s"], m["decode_per_ctx_s"], m["decode_per_key_s"])}
    for mode, r in report["modes"].items():
        times = r["runtime_model_time"]
        assert len(times) == 2
        for role, (fixed, per_item, per_ctx, per_key) in fits.items():
            busy = sum(t[role]["busy_s"] for t in times)
            pred = sum(fixed * t[role]["forwards"] + per_item * t[role]["fit_terms"][0]
                       + per_ctx * t[role]["fit_terms"][1] + per_key * t[role]["fit_terms"][2] for t in times)
            assert busy > 0 and pred > 0
            assert r["in_run_speed"][role] == pytest.approx(busy / pred)
        for t in times:  # decode: sequences per step as de_batch_mean counts them; keys = sequences x longest
            d = t["decode"]
            items, ctx, keys = d["fit_terms"]
            assert 0 < ctx <= keys <= items * ctx
        batch = r["metrics"]["de_batch_mean"]["runtime_runs"]
        assert [t["decode"]["fit_terms"][0] / t["decode"]["forwards"] for t in times] == pytest.approx(batch)
        for name, alt in r["sim_start_speed"].items():
            mean = r["metrics"][name]["runtime_mean"]
            if mean:
                assert alt["rel_error"] == pytest.approx(alt["sim"] / mean - 1)
