"""CLI errors are one line on stderr whatever the terminal width, a pipe or a terminal (errors.InputError)."""

import os
import pty
import subprocess
import sys

import pytest

from dualpath.errors import error_line

MOONCAKE_LINE = '{"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]}\n'


def cli(*args, cwd=None, columns=None):
    env = dict(os.environ)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run([sys.executable, "-m", "dualpath.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=120)


def long_dir(tmp_path, min_chars=200):
    d = tmp_path
    while len(str(d)) < min_chars:
        d = d / ("long-directory-name-" * 3).rstrip("-")
    d.mkdir(parents=True)
    return d


@pytest.mark.parametrize("columns", [None, 40, 80])
def test_a_mooncake_trace_error_is_one_line_from_a_200_char_directory(tmp_path, columns):
    d = long_dir(tmp_path)
    (d / "mc.jsonl").write_text(MOONCAKE_LINE)
    p = cli("sim", "--trajectories", str(d / "mc.jsonl"), "--max-len", "512", "--quiet", cwd=d, columns=columns)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines() == [f"error: {d / 'mc.jsonl'}: no request fits --max-len 512 (input + output tokens)"]


def test_a_long_input_error_is_one_line_at_40_columns(tmp_path):
    missing = long_dir(tmp_path) / "missing.jsonl"
    p = cli("sim", "--trajectories", str(missing), "--agents", "1", "--quiet", columns=40)
    assert p.returncode == 2
    assert p.stderr.splitlines() == [f"error: workload file not found: {missing}"]


@pytest.mark.parametrize("args,message", [
    (["sim", "--no-such-option"], "error: No such option: --no-such-option (try 'dualpath sim --help')"),
    (["sim", "--agents", "many"], "error: Invalid value for '--agents'"),
    (["trace", "stats"], "error: Missing argument"),
])
def test_usage_errors_are_one_line_exit_2_without_traceback(args, message):
    p = subprocess.run([sys.executable, "-c", "import sys; sys.argv[0] = 'dualpath'; from dualpath.cli import main; main()", *args],
                       capture_output=True, text=True, env={**os.environ, "COLUMNS": "40"}, timeout=120)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and "╭" not in p.stderr
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith(message), p.stderr


def test_an_error_on_a_terminal_is_one_line_too(tmp_path):
    """stderr a pseudo-terminal 40 columns wide: rich would wrap there, a plain write does not."""
    missing = long_dir(tmp_path) / "missing.jsonl"
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "dualpath.cli", "sim", "--trajectories", str(missing), "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=follower, env={**os.environ, "COLUMNS": "40"})
    os.close(follower)
    assert proc.wait(timeout=120) == 2
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the terminal's last writer has gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    text = b"".join(chunks).decode()
    assert text.splitlines() == [f"error: workload file not found: {missing}"]


def test_error_line_joins_embedded_line_breaks():
    assert error_line("bad value\n  on line 3\r\nof x.jsonl\n") == "error: bad value on line 3 of x.jsonl"
