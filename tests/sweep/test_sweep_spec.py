"""The sweep spec: a valid grid expands in axis order; every bad key or value is one InputError
naming it; the CLI turns it into one `error:` line and exit 2 before anything runs."""

import pytest

from cli_helpers import cli_here
from dualpath.errors import InputError
from dualpath.sweep.spec import load_spec, parse_spec

GOOD = {"model": "ds-27b", "pd": ["1P1D", "1P2D"], "max_len": "32k", "agents": [16, 32], "mode": ["basic", "dualpath"]}


def test_grid_expands_in_axis_order_with_default_seed():
    points = parse_spec(GOOD).points()
    assert len(points) == 8
    assert [(p.spec.pd, p.spec.num_agents, p.spec.mode, p.seed) for p in points[:3]] == [
        ("1P1D", 16, "basic", 1), ("1P1D", 16, "dualpath", 1), ("1P1D", 32, "basic", 1)]
    assert {p.spec.max_len_tokens for p in points} == {32768}


def test_default_pd_is_the_papers_and_seeds_multiply():
    spec = parse_spec({**{k: v for k, v in GOOD.items() if k != "pd"}, "seed": [1, 2, 3]})
    points = spec.points()
    assert {p.spec.pd for p in points} == {"1P1D"}  # the paper's shape for DS 27B
    assert len(points) == 2 * 2 * 3
    assert [p.seed for p in points[:3]] == [1, 2, 3]


def test_tool_time_is_an_axis_of_the_grid_and_of_each_run():
    points = parse_spec({**GOOD, "pd": "1P1D", "agents": 16, "tool_time": [0, 2.5]}).points()
    assert [(p.spec.tool_time_s, p.spec.mode) for p in points] == [(0.0, "basic"), (0.0, "dualpath"),
                                                                    (2.5, "basic"), (2.5, "dualpath")]
    from dualpath.experiments.simrun import sim_config

    assert sim_config(points[2].spec, 1).workload.tool_time_median_s == 2.5
    assert "tool 2.5 s" in points[2].spec.label() and "tool" not in points[0].spec.label()


@pytest.mark.parametrize("bad, words", [
    ({**GOOD, "modes": ["basic"]}, ["unknown key", "'modes'"]),
    ({k: v for k, v in GOOD.items() if k != "agents"}, ["missing key", "'agents'"]),
    ({**GOOD, "model": "gpt-9"}, ["model", "gpt-9"]),
    ({**GOOD, "pd": "2X4D"}, ["pd", "2X4D"]),
    ({**GOOD, "max_len": "lots"}, ["max_len", "lots"]),
    ({**GOOD, "agents": [16, -1]}, ["agents", "-1"]),
    ({**GOOD, "agents": 2.5}, ["agents", "2.5"]),
    ({**GOOD, "mode": ["fast"]}, ["mode", "fast"]),
    ({**GOOD, "seed": [-3]}, ["seed", "-3"]),
    ({**GOOD, "tool_time": [-1]}, ["tool_time", "-1"]),
    ({**GOOD, "tool_time": ".inf"}, ["tool_time", ".inf"]),
    ({**GOOD, "mode": []}, ["mode", "empty"]),
    ({**GOOD, "agents": [16, 16]}, ["agents", "twice"]),
    ({**GOOD, "agents": {"a": 1}}, ["agents"]),
    ({**GOOD, "agents": list(range(1, 20_001))}, ["runs", "more than"]),
    ([1, 2], ["mapping"]),
])
def test_bad_specs_name_the_key_and_value(bad, words):
    with pytest.raises(InputError) as e:
        parse_spec(bad, "s.yaml")
    msg = str(e.value)
    assert msg.startswith("s.yaml:") and all(w in msg for w in words), msg


def test_file_errors(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_spec(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [ds-27b\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_spec(bad)


def test_cli_bad_spec_is_one_error_line_and_exit_2(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("model: ds-27b\nmax_len: 32k\nagents: 16\nmode: basic\ncolour: red\n")
    r = cli_here("sweep", str(spec), "--out", str(tmp_path / "o"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "'colour'" in lines[0], r.stderr
    assert not (tmp_path / "o").exists()  # nothing ran


def test_example_spec_is_valid():
    from pathlib import Path

    spec = load_spec(Path(__file__).resolve().parents[2] / "examples" / "sweep.yaml")
    assert len(spec.points()) == 16
