"""`dualpath docs check` / `build`: the generated blocks of README.md and docs/ follow the results
JSONs. The repository is up to date; on a copy, changing one number of any JSON a block reads, or
hand-editing a generated table, makes `check` exit 1 naming the block, and `build` repairs it
without touching the hand-written text."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from cli_helpers import cli_here

from dualpath.docs.blocks import REGISTRY
from dualpath.docs.markers import find_slots

REPO = Path(__file__).resolve().parents[2]
READERS = {rel: {b.name for b in REGISTRY.values() if rel in b.reads} for b in REGISTRY.values() for rel in b.reads}
NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?")
UP_TO_DATE = re.compile(r"\d+ blocks, \d+ JSONs: up to date\n")


def copy_docs(root: Path) -> Path:
    """README.md and docs/ (without the figures) under `root`."""
    shutil.copy2(REPO / "README.md", root / "README.md")
    shutil.copytree(REPO / "docs", root / "docs", ignore=shutil.ignore_patterns("*.png"))
    return root


def check(root: Path):
    return cli_here("docs", "check", "--root", str(root))


def first_number(text: str) -> re.Match:
    """The first JSON number token of `text` (outside strings)."""
    i = 0
    while i < len(text):
        if text[i] == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif text[i] in "-0123456789":
            return NUMBER.match(text, i)
        i += 1
    raise AssertionError("no number in the file")


def change_one_number(path: Path) -> None:
    """Change the leading digit of the file's first number (0-8 up by one, 9 to 1: still a JSON
    number, another value); every other byte stays."""
    text = path.read_text()
    at = first_number(text).start() + (text[first_number(text).start()] == "-")
    new = text[:at] + str(int(text[at]) % 9 + 1) + text[at + 1:]
    assert json.loads(new) != json.loads(text)
    path.write_text(new)


def drop_key(path: Path, key: str) -> None:
    d = json.loads(path.read_text())
    del d[key]
    path.write_text(json.dumps(d))


def named_block(output: str) -> str:
    m = re.search(r"generated block '([^']+)'", output)
    assert m, output
    return m.group(1)


def test_the_repository_is_up_to_date():
    p = check(REPO)
    assert p.returncode == 0, p.stdout + p.stderr
    assert UP_TO_DATE.fullmatch(p.stdout)


@pytest.fixture(scope="module")
def shared_copy(tmp_path_factory) -> Path:
    """One copy for the per-JSON cases; each restores the file it changed."""
    return copy_docs(tmp_path_factory.mktemp("docs"))


@pytest.mark.parametrize("rel", sorted(READERS))
def test_changing_one_number_of_a_json_a_block_reads_fails_the_check_naming_that_block(shared_copy, rel):
    path = shared_copy / "docs" / "results" / rel
    original = path.read_bytes()
    try:
        change_one_number(path)
        p = check(shared_copy)
    finally:
        path.write_bytes(original)
    assert p.returncode == 1, p.stdout + p.stderr
    assert named_block(p.stderr) in READERS[rel]
    assert "committed:" in p.stderr and "build:" in p.stderr


def test_a_hand_edited_table_fails_the_check_and_build_restores_it_keeping_the_prose(tmp_path):
    root = copy_docs(tmp_path)
    results_md = root / "docs" / "results.md"
    lines = results_md.read_text().split("\n")
    slot = next(s for s in find_slots("results.md", lines) if s.name == "demo")
    row = next(i for i in range(slot.start, slot.end) if lines[i].startswith("| basic |"))
    lines[row] = lines[row].replace("| basic |", "| basic (edited) |")
    lines.insert(slot.start, "A hand-written line above the block.")
    results_md.write_text("\n".join(lines))

    p = check(root)
    assert p.returncode == 1
    assert p.stderr.startswith(f"docs/results.md:{row + 2}: generated block 'demo'"), p.stderr
    assert "basic (edited)" in p.stderr

    assert cli_here("docs", "build", "--root", str(root)).returncode == 0
    p = check(root)
    assert p.returncode == 0, p.stderr
    text = results_md.read_text()
    assert "A hand-written line above the block." in text and "basic (edited)" not in text
    assert text.replace("A hand-written line above the block.\n", "", 1) == (REPO / "docs" / "results.md").read_text()


def test_build_writes_the_numbers_of_the_json(tmp_path):
    root = copy_docs(tmp_path)
    demo = root / "docs" / "results" / "runtime" / "demo.json"
    d = json.loads(demo.read_text())
    basic = next(r for r in d["runs"] if r["mode"] == "basic")
    basic["jct_s"] = 1234.5
    demo.write_text(json.dumps(d, indent=2))
    assert check(root).returncode == 1
    assert cli_here("docs", "build", "--root", str(root)).returncode == 0
    assert "| basic | 1,234.5 |" in (root / "README.md").read_text()
    assert "| basic | 1,234.5 |" in (root / "docs" / "results.md").read_text()


@pytest.mark.parametrize("breakage,needle", [
    (lambda root: (root / "docs" / "results" / "runtime" / "demo_cold.json").unlink(),
     "docs/results/runtime/demo_cold.json: not found"),
    (lambda root: drop_key(root / "docs" / "results" / "runtime" / "store.json", "num_blocks"),
     "docs/results/runtime/store.json: no key ['num_blocks']"),
    (lambda root: (root / "docs" / "extra.md").write_text("<!-- generated: no_such_block -->\n<!-- end generated -->\n"),
     "docs/extra.md:1: unknown generated block 'no_such_block'"),
    (lambda root: (root / "docs" / "extra.md").write_text("<!-- generated: demo -->\ntext\n"),
     "docs/extra.md:1: generated block 'demo' has no '<!-- end generated -->'"),
    (lambda root: (root / "docs" / "extra.md").write_text("<!-- generated demo -->\n"),
     "docs/extra.md:1: malformed marker"),
])
def test_a_missing_json_key_or_block_is_one_error_line_and_exit_2(tmp_path, breakage, needle):
    root = copy_docs(tmp_path)
    breakage(root)
    p = check(root)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stderr.startswith("error: ") and p.stderr.count("\n") == 1, p.stderr
    assert needle in p.stderr


def test_a_root_without_results_is_refused(tmp_path):
    p = check(tmp_path)
    assert p.returncode == 2 and "no docs/results" in p.stderr
