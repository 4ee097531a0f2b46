"""pyflakes over the code: an undefined name (a moved helper whose import stayed behind) fails
here instead of at the first run of a rarely used command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_pyflakes_finds_nothing():
    p = subprocess.run([sys.executable, "-m", "pyflakes", "src", "tests", "tools"], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 0 and not p.stdout, p.stdout + p.stderr


def test_pyflakes_reports_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return best_time_s()\n")
    p = subprocess.run([sys.executable, "-m", "pyflakes", str(bad)], capture_output=True, text=True)
    assert p.returncode == 1 and "undefined name 'best_time_s'" in p.stdout
