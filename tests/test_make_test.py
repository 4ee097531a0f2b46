"""CI runs `make test` (.ci/run), and its log ends with pytest's summary line ("N passed, M
deselected in S s"): the Makefile's pytest options and pyproject's `addopts` together must not
quieten pytest past one -q (-qq drops that line)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _make_test_pytest_args() -> list[str]:
    """The options the Makefile's `test` target passes to pytest."""
    recipe = re.search(r"^test: .*\n\t(.+)$", (REPO / "Makefile").read_text(), flags=re.M)
    assert recipe, "no `test` target in the Makefile"
    words = shlex.split(recipe.group(1))
    assert words[:3] == ["$(BIN)/python", "-m", "pytest"], words
    return words[3:]


def test_ci_runs_exactly_make_test():
    lines = [line for line in (REPO / ".ci" / "run").read_text().splitlines() if line and not line.startswith("#")]
    assert lines[-1] == "make test"


def test_make_tests_pytest_prints_the_summary_line():
    args = _make_test_pytest_args()
    p = subprocess.run([sys.executable, "-m", "pytest", *args, "-p", "no:cacheprovider", "tests/core/test_phase.py"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert re.search(r"^\d+ passed(, \d+ deselected)? in [\d.]+s", p.stdout, flags=re.M), p.stdout[-2000:]
