"""The command line: outputs, JSON keys, and clear errors with exit code 2 for bad input."""

import json

import pytest
from cli_helpers import cli, cli_here

from dualpath.workloads import MOONCAKE_SLICE




@pytest.mark.parametrize(
    "args,needle",
    [
        (["sim", "--model", "gpt-5"], "unknown model"),
        (["sim", "--pd", "2X4"], "malformed P/D"),
        (["sim", "--pd", "0P4D"], "at least one prefill"),
        (["sim", "--agents", "0"], "--agents must be positive"),
        (["sim", "--agents", "-3"], "--agents must be positive"),
        (["sim", "--max-len", "sixty"], "malformed token count"),
        (["sim", "--mode", "turbo"], "unknown mode"),
        (["sim", "--aps", "-1", "--agents", "2"], "--aps must be positive"),
        (["trace", "gen", "--max-len", "1k", "-o", "/tmp/never.jsonl"], "max_len_tokens"),
        (["trace", "gen", "--agents", "0"], "--agents must be positive"),
        (["trace", "stats", "/nonexistent/file.jsonl"], "not found"),
        (["bench", "sim-speed", "--agents", "10,x"], "comma-separated"),
    ],
)
def test_bad_input_exits_2_with_a_message_and_no_traceback(args, needle):
    p = cli_here(*args)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr + p.stdout
    assert "Traceback" not in p.stderr


def test_malformed_trace_line_names_the_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"agent": 0, "rounds": [[10, 2]]}\n{"agent": 1, "rounds": [[10, "x"]]}\n')
    p = cli("trace", "stats", str(f))
    assert p.returncode == 2
    assert "line 2" in p.stderr
    assert "Traceback" not in p.stderr


def test_sim_refuses_a_workload_file_of_neither_format_naming_the_keys(tmp_path):
    f = tmp_path / "other.jsonl"
    f.write_text('{"prompt": "hello"}\n')
    p = cli("sim", "--trajectories", str(f), "--agents", "1", "--quiet")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "unknown workload format" in p.stderr and "'hash_ids'" in p.stderr


def test_max_len_smaller_than_a_first_round_is_a_clear_error(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text('{"agent": 0, "rounds": [[5000, 2], [10, 2]]}\n')
    p = cli("sim", "--trajectories", str(f), "--agents", "1", "--max-len", "4096", "--quiet")
    assert p.returncode == 2
    assert "smaller than the first round" in p.stderr


def test_trace_gen_then_stats_round_trip(tmp_path):
    out = tmp_path / "t.jsonl"
    assert cli("trace", "gen", "--max-len", "32k", "--agents", "40", "--seed", "3", "-o", str(out)).returncode == 0
    p = cli("trace", "stats", str(out), "--json")
    assert p.returncode == 0
    stats = json.loads(p.stdout)
    for key in ("num_requests", "num_agents", "mean_turns", "mean_input_tokens", "mean_append_tokens",
                "mean_output_tokens", "mean_total_tokens", "mean_context_tokens", "prefix_hit_ratio"):
        assert key in stats
    assert stats["num_agents"] == 40
    assert stats["num_requests"] == pytest.approx(stats["mean_turns"] * 40)
    assert 0.9 < stats["prefix_hit_ratio"] < 1.0


def test_sim_writes_json_with_the_documented_keys_and_a_plot(tmp_path):
    j, png = tmp_path / "o.json", tmp_path / "o.png"
    p = cli("sim", "--model", "ds-27b", "--pd", "1P1D", "--max-len", "32k", "--agents", "12",
            "--mode", "basic", "--mode", "dualpath", "--mode", "oracle", "--seed", "1",
            "--json", str(j), "--plot", str(png), "--quiet")
    assert p.returncode == 0, p.stderr
    data = json.loads(j.read_text())
    assert data["config"]["cluster"]["model"] == "ds-27b"
    assert [r["mode"] for r in data["runs"]] == ["basic", "dualpath", "oracle"]
    for r in data["runs"]:
        for key in ("mode", "jct_s", "ttft_s", "ttst_s", "tpot_s", "bytes", "snic_max_over_avg", "num_turns", "wall_s", "num_events"):
            assert key in r
        for key in ("mean", "p50", "p90", "p99"):
            assert key in r["ttft_s"] and key in r["tpot_s"] and key in r["ttst_s"]
        for key in ("storage_to_prefill", "storage_via_decode", "persisted"):
            assert key in r["bytes"]
    assert png.stat().st_size > 10_000 and png.read_bytes()[:4] == b"\x89PNG"
    assert "JCT" in p.stdout


def test_sim_turns_csv_has_one_consistent_row_per_turn_and_mode(tmp_path):
    import csv

    j, turns = tmp_path / "o.json", tmp_path / "t" / "turns.csv"
    p = cli("sim", "--model", "ds-27b", "--pd", "2P1D", "--max-len", "32k", "--agents", "10",
            "--mode", "basic", "--mode", "dualpath", "--seed", "3", "--json", str(j), "--turns", str(turns), "--quiet")
    assert p.returncode == 0, p.stderr
    runs = {r["mode"]: r for r in json.loads(j.read_text())["runs"]}
    rows = list(csv.DictReader(turns.open()))
    gpus = json.loads(j.read_text())["config"]["cluster"]["node"]["gpus_per_node"]
    for mode, r in runs.items():
        mine = [x for x in rows if x["mode"] == mode]
        assert len(mine) == r["num_turns"]
        assert len({(x["agent"], x["turn"]) for x in mine}) == len(mine)
        assert max(float(x["finish_s"]) for x in mine) == pytest.approx(r["jct_s"])
        for x in mine:
            f = {k: float(v) for k, v in x.items() if k != "mode"}
            parts = f["sched_s"] + f["alloc_s"] + f["read_s"] + f["prefill_s"]
            assert parts == pytest.approx(f["first_s"] - f["arrival_s"], abs=1e-6)
            assert 0 <= f["batch_wait_s"] <= f["prefill_s"] + 1e-9
            assert f["pe_engine"] < 2 * gpus <= f["de_engine"]  # nodes 0-1 prefill, node 2 decode
        if mode == "basic":
            assert all(x["read_side"] == "0" for x in mine)


def test_mooncake_trace_stats_from_the_cli():
    """The shipped slice of the Mooncake trace (workloads/data/README.md)."""
    p = cli("trace", "stats", str(MOONCAKE_SLICE), "--json")
    assert p.returncode == 0, p.stderr
    stats = json.loads(p.stdout)
    assert stats["num_requests"] == 3658
    assert stats["mean_input_tokens"] == pytest.approx(13403.12, abs=0.01)
    assert stats["request_mean_output_tokens"] == pytest.approx(348.50, abs=0.01)
