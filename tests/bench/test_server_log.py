"""bench/overload.py: `stop_server` removes the temporary log `start_server` made once the server
stops on its SIGTERM, and keeps a log the caller named (or one of a server that did not stop cleanly)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from dualpath.bench.overload import stop_server


def _sleeper(log: Path, temporary: bool) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc.log_path = log  # type: ignore[attr-defined]  # as start_server sets them
    proc.log_is_temporary = temporary  # type: ignore[attr-defined]
    return proc


def test_a_temporary_log_goes_with_a_clean_stop_and_a_named_one_stays(tmp_path):
    temp = Path(tempfile.mkstemp(prefix="dualpath-serve-test-", suffix=".log")[1])
    stop_server(_sleeper(temp, True))
    assert not temp.exists()
    named = tmp_path / "serve.log"
    named.write_text("kept")
    stop_server(_sleeper(named, False))
    assert named.read_text() == "kept"


def test_the_log_of_a_server_that_did_not_stop_cleanly_stays(tmp_path, capsys):
    log = tmp_path / "serve.log"
    log.write_text("why it failed")
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    proc.wait()
    proc.log_path, proc.log_is_temporary = log, True  # type: ignore[attr-defined]
    stop_server(proc)
    assert log.read_text() == "why it failed" and str(log) in capsys.readouterr().err
