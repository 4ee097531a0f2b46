"""Progress without a terminal (a pipe, a CI log): throttled plain lines, flushed one by one."""

import io
import json
import re
import subprocess
import sys

import pytest

from rich.console import Console

from dualpath.experiments.cli import PlainLinesProgress
from dualpath.progress import LiveProgress, PlainProgress, reporter


class FakeClock:
    def __init__(self) -> None:
        self.t_s = 100.0

    def __call__(self) -> float:
        return self.t_s


class FlushLog(io.StringIO):
    """Records what had been written at each flush: one entry per flushed line."""

    def __init__(self) -> None:
        super().__init__()
        self.flushed: list[str] = []

    def flush(self) -> None:
        self.flushed.append(self.getvalue())
        super().flush()


def lines_of(stream: io.StringIO) -> list[str]:
    return stream.getvalue().splitlines()


def test_lines_are_throttled_and_each_mode_ends_with_a_line():
    clock, stream = FakeClock(), FlushLog()
    p = PlainProgress("sim", "agents", stream, clock=clock, interval_s=5.0)
    for done in range(1, 13):  # one update per second, 12 of 20 agents
        clock.t_s += 1.0
        p.update("basic", done, 20)
    assert lines_of(stream) == ["sim basic: 5/20 agents, 5.0 s", "sim basic: 10/20 agents, 10.0 s"]
    clock.t_s += 0.5
    p.update("basic", 20, 20)  # the mode ends: a line at once, whatever the throttle
    p.update("basic", 20, 20)  # ... and only one
    clock.t_s += 0.5
    p.update("dualpath", 3, 20)
    clock.t_s += 2.0
    p.update("oracle", 1, 20)  # a new mode ends the previous one (an online run stops short of its total)
    clock.t_s += 1.0
    p.close()  # and closing ends the last
    assert lines_of(stream)[2:] == ["sim basic: 20/20 agents, 12.5 s", "sim dualpath: 3/20 agents, 15.0 s",
                                    "sim oracle: 1/20 agents, 16.0 s"]
    text = stream.getvalue()
    assert "\x1b" not in text and "\r" not in text
    # flushed after every line, never holding one back
    assert stream.flushed == ["".join(line + "\n" for line in lines_of(stream)[: i + 1]) for i in range(5)]


def test_snic_utilisation_is_per_node_over_the_interval_since_the_last_line():
    clock, stream = FakeClock(), io.StringIO()
    p = PlainProgress("demo", "turns", stream, clock=clock, interval_s=5.0, snic_bytes_per_s=30e6)
    p.update("basic", 1, 60, {})  # no engine has reported its counters yet
    read = {"PE0": 0, "DE1": 0}
    for done in range(2, 12):  # PE0 reads at the cap, DE1 at half of it
        clock.t_s += 1.0
        read = {"PE0": read["PE0"] + 30_000_000, "DE1": read["DE1"] + 15_000_000}
        p.update("basic", done, 60, read)
    assert lines_of(stream) == [
        "demo basic: 6/60 turns, 5.0 s, SNIC util PE0 1.00 (30 MB/s), DE1 0.50 (15 MB/s)",  # the window opened at the mode's first update
        "demo basic: 11/60 turns, 10.0 s, SNIC util PE0 1.00 (30 MB/s), DE1 0.50 (15 MB/s)"]
    p.update("dualpath", 1, 60, {})
    p.close()
    # the mode ends at the instant of its last line: too short a window, so it reaches back to the
    # previous one; the new mode has no counters yet
    assert lines_of(stream)[2:] == ["demo basic: 11/60 turns, 10.0 s, SNIC util PE0 1.00 (30 MB/s), DE1 0.50 (15 MB/s)",
                                    "demo dualpath: 1/60 turns, 10.0 s, SNIC util -"]


def test_without_a_snic_cap_the_rate_is_shown_and_the_utilisation_is_unknown():
    clock, stream = FakeClock(), io.StringIO()
    p = PlainProgress("run", "turns", stream, clock=clock, interval_s=1.0)
    p.update("dualpath", 1, 4, {"PE0": 0})
    clock.t_s += 2.0
    p.update("dualpath", 2, 4, {"PE0": 8_000_000})
    assert lines_of(stream) == ["run dualpath: 2/4 turns, 2.0 s, SNIC util PE0 - (4 MB/s)"]


def test_a_terminal_gets_the_live_bar_anything_else_plain_lines():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    console = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(reporter("sim", "agents", console, stream=Tty()), LiveProgress)
    plain = reporter("sim", "agents", console, stream=io.StringIO())
    assert isinstance(plain, PlainProgress)
    with reporter("demo", "turns", console, stream=Tty(), snic_bytes_per_s=1e6) as live:
        live.update("basic", 1, 2, {"PE0": 10})
        live.update("basic", 2, 2, {"PE0": 20})
    assert "demo basic (turns)" in console.file.getvalue()


def test_repro_sink_prints_experiments_and_simulations_as_plain_lines():
    clock, stream = FakeClock(), io.StringIO()
    lines = PlainProgress("repro", "agents", stream, clock=clock, interval_s=5.0)
    sink = PlainLinesProgress(lines, 2)
    sink.start_experiment("fig7")
    task = sink.start_sim("fig7/basic", 100)
    clock.t_s += 6.0
    sink.update_sim(task, 40, 100)
    clock.t_s += 1.0
    sink.update_sim(task, 100, 100)
    sink.end_sim(task)
    sink.end_experiment("fig7", 7.0)
    assert lines_of(stream) == ["repro: experiment fig7 (1/2)", "repro fig7/basic: 40/100 agents, 6.0 s",
                                "repro fig7/basic: 100/100 agents, 7.0 s", "repro: fig7: done in 7 s"]


def test_sim_on_a_pipe_prints_a_plain_line_per_mode():
    p = subprocess.run([sys.executable, "-m", "dualpath.cli", "sim", "--agents", "8", "--max-len", "16k",
                        "--mode", "basic", "--mode", "dualpath"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    progress = [line for line in p.stdout.splitlines() if line.startswith("sim ")]
    assert [re.sub(r"[\d.]+ s$", "T s", line) for line in progress] == ["sim basic: 8/8 agents, T s",
                                                                       "sim dualpath: 8/8 agents, T s"]
    assert "\x1b" not in p.stdout + p.stderr


@pytest.mark.slow  # 10 s; `run` of a trajectory file keeps a default test (test_cli_runtime.py)
def test_run_of_a_mooncake_trace_reports_its_requests(tmp_path):
    f = tmp_path / "mc.jsonl"
    f.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}) + "\n"
                         for i in range(3)))
    p = subprocess.run([sys.executable, "-m", "dualpath.cli", "run", str(f), "--model", "tiny", "--snic-mb-s", "30"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    assert re.search(r"^run dualpath: 3/3 turns, [\d.]+ s, SNIC util ", p.stdout, re.M), p.stdout
    assert "\x1b" not in p.stdout
