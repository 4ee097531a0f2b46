"""Running `dualpath` from a test: in a fresh process, as a user runs it, or in this one.

`cli_here` is for the checks that end before anything starts (bad input: one error line, exit 2). It
runs the same entry point (`errors.run_cli` on the typer app) with the arguments in `sys.argv` and
stdout / stderr captured, and saves a Python and torch start-up per case (~2 s each on CI's
machine). An exception that escapes `run_cli` (a bug that would print a traceback) fails the test
with that traceback."""

from __future__ import annotations

import contextlib
import io
import os
import selectors
import subprocess
import sys
import time


def cli(*args: str, cwd=None, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`python -m dualpath.cli ARGS` in a child process; text output captured."""
    return subprocess.run([sys.executable, "-m", "dualpath.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=None if env is None else {**os.environ, **env}, timeout=timeout)


def cli_here(*args: str) -> subprocess.CompletedProcess:
    """The same command in this process: its exit code, stdout and stderr."""
    from dualpath.cli.main import app
    from dualpath.errors import run_cli

    out, err = io.StringIO(), io.StringIO()
    argv, code = sys.argv, 0
    sys.argv = ["dualpath", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            run_cli(app)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
    return subprocess.CompletedProcess(["dualpath", *args], code, out.getvalue(), err.getvalue())


def read_lines_while_running(proc: subprocess.Popen, timeout_s: float) -> list[tuple[str, float, bool]]:
    """(line, arrival time, process still running) for each stdout line, until EOF."""
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    fd, buf, out = proc.stdout.fileno(), b"", []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not sel.select(timeout=1.0):
            continue
        chunk = os.read(fd, 65536)
        now, running = time.monotonic(), proc.poll() is None
        if not chunk:
            return out
        buf += chunk
        *complete, buf = buf.split(b"\n")
        out += [(line.decode(), now, running) for line in complete]
    proc.kill()
    raise AssertionError(f"no EOF within {timeout_s} s; read {out}")
