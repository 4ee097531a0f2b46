"""`dualpath bench sim-speed --builds ... --against ...` (bench/sim_speed.py `side_by_side`): each
variant in its own process, the variants interleaved agent count by agent count, every row named
by its variant, and the refusals of what it cannot run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dualpath import _build
from dualpath.bench.sim_speed import Variant, side_by_side, variants
from dualpath.errors import InputError

SRC = _build.PACKAGE_DIR.parent


def test_variants_name_this_trees_builds_then_the_other_checkout(tmp_path):
    other = tmp_path / "base" / "src"
    (other / "dualpath").mkdir(parents=True)
    (other / "dualpath" / "__init__.py").write_text("")
    vs = variants(["pure", "compiled"], SRC, other)
    assert vs == [Variant("pure", SRC, "pure"), Variant("compiled", SRC, "compiled"), Variant("base", other, None)]
    with pytest.raises(InputError, match="unknown build 'fast'"):
        variants(["fast"], SRC, None)
    with pytest.raises(InputError, match="not a src/ folder"):
        variants(["pure"], SRC, tmp_path)


def test_side_by_side_interleaves_variants_and_keeps_their_numbers_apart(tmp_path):
    """This tree's pure build beside a copy of its sources (standing in for older code): the same
    simulation, so the same JCT and events; rows in the order count by count, variant by variant."""
    other = tmp_path / "copy" / "src"
    shutil.copytree(_build.PACKAGE_DIR, other / "dualpath",
                    ignore=shutil.ignore_patterns("*.so", "_compiled.json", "__pycache__"))
    vs = [Variant("pure", SRC, "pure"), Variant("copy", other, None)]
    out = tmp_path / "speed.json"
    result = side_by_side("ds-v3.2-660b", "2P4D", "64k", [2, 4], "dualpath", 1, vs, out, None)
    assert [(r["agents"], r["variant"]) for r in result["rows"]] == [(2, "pure"), (2, "copy"), (4, "pure"), (4, "copy")]
    by = {(r["agents"], r["variant"]): r for r in result["rows"]}
    for n in (2, 4):
        assert by[(n, "pure")]["jct_s"] == by[(n, "copy")]["jct_s"] > 0
        assert by[(n, "pure")]["num_events"] == by[(n, "copy")]["num_events"]
    assert by[(4, "pure")]["num_turns"] > by[(2, "pure")]["num_turns"]
    saved = json.loads(Path(out).read_text())
    assert [v["label"] for v in saved["variants"]] == ["pure", "copy"]
    assert saved["variants"][0]["src"] == "this tree" and saved["variants"][1]["src"] == str(other)
    assert {v["build"] for v in saved["variants"]} == {"pure"}  # a copy without a compiled build runs pure
    assert saved["variants"][0]["simulator_code"] == saved["variants"][1]["simulator_code"]
