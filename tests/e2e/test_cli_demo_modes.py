"""`dualpath demo --modes`: any modes on one cluster in one run; split reads and a DRAM tier give
basic's tokens (tiny model: real engine processes, seconds)."""

import json

import pytest
from cli_helpers import cli, cli_here

# rounds of the demo's agents: the 9th round's hit is 10 blocks (190 + 2 + 8 x 64 tokens of context),
# past the split's default minimum (MIN_SPLIT_BLOCKS, 8), so the later rounds split their hits
ROUNDS = 12


def test_demo_runs_the_given_modes_with_basics_tokens_and_splits_reads(tmp_path):
    j = tmp_path / "demo.json"
    p = cli("demo", "--model", "tiny", "--modes", "basic,dualpath,dualpath+split,dualpath+dram", "--rounds", str(ROUNDS),
            "--json", str(j), "--plot", str(tmp_path / "demo.png"))
    assert p.returncode == 0, p.stderr[-3000:]
    result = json.loads(j.read_text())
    runs = {r["mode"]: r for r in result["runs"]}
    assert list(runs) == ["basic", "dualpath", "dualpath+split", "dualpath+dram"]
    # the same tokens whichever side (or both) read each hit, from storage or from a node's DRAM
    assert len({r["tokens_sha256"] for r in runs.values()}) == 1
    dram = sum(e["dram_read_bytes"] for e in runs["dualpath+dram"]["snic"].values())
    assert dram > 0 and all(e["dram_read_bytes"] == 0 for m in ("basic", "dualpath") for e in runs[m]["snic"].values())
    both = runs["dualpath+dram"]["bytes"]  # what the tiers served is not read from storage
    assert both["storage_to_prefill"] + both["storage_via_decode"] + dram == runs["basic"]["bytes"]["storage_to_prefill"]
    split = runs["dualpath+split"]["bytes"]  # both nodes read (that one request's hit is split between
    assert split["storage_to_prefill"] > 0 and split["storage_via_decode"] > 0  # them: test_runtime_split_reads.py)
    total = {m: r["bytes"]["storage_to_prefill"] + r["bytes"]["storage_via_decode"] for m, r in runs.items()}
    assert total["dualpath+split"] == total["basic"]  # the same hits, read once, wherever
    assert runs["basic"]["jct_over_basic"] == 1.0
    for m in ("dualpath", "dualpath+split"):
        assert runs[m]["jct_over_basic"] == pytest.approx(runs[m]["jct_s"] / runs["basic"]["jct_s"])
        assert f"JCT {m} / basic = {runs[m]['jct_over_basic']:.2f}" in p.stdout
        assert f"{m}: JCT" in p.stdout and "(basic's)" in p.stdout
    assert f"tokens_sha256 {runs['basic']['tokens_sha256'][:16]}" in p.stdout


@pytest.mark.parametrize("modes,needle", [
    ("basic,warp", "unknown mode 'warp'"),
    ("basic,dualpath,basic", "names a mode twice"),
    (",", "name at least one mode"),
])
def test_demo_bad_modes_are_one_line_errors(modes, needle):
    p = cli_here("demo", "--model", "tiny", "--modes", modes)
    assert p.returncode == 2, (p.returncode, p.stderr[-2000:])
    assert needle in p.stderr and p.stderr.count("error") == 1 and "Traceback" not in p.stderr
