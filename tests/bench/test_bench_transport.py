"""`dualpath bench transport`: the four KV transfers side by side in a small run (the tiny model's
blocks, 1 MiB, two rounds). Every transfer lands the source's bytes (checksums of what arrived), the
JSON has a row per transfer with positive rates and memcpy's ratio 1; without Mooncake its row is one
skip line and the other three run; bad input is one line and exit 2."""

from __future__ import annotations

import json
import sys

import pytest

from cli_helpers import cli_here

from dualpath.bench.transport_run import FULL_BLOCK, LAYER_BLOCK, block_sizes, model_layout
from dualpath.config import RuntimeConfig
from dualpath.docs.blocks.store import TRANSPORT_LABELS, transport_table
from dualpath.runtime.model.loader import tiny_config
from dualpath.runtime.transport.mooncake import INSTALL_HINT, mooncake_loads

SMALL = ("--model", "tiny", "--total-mib", "1", "--rounds", "2", "--latency-blocks", "4")


def test_the_block_sizes_are_the_engines_layer_and_full_blocks():
    cfg = RuntimeConfig(model="tiny")
    mcfg = tiny_config(cfg.seed)
    layer_bytes = cfg.block_tokens * 2 * mcfg.num_kv_heads * mcfg.head_dim * 4  # K and V, float32
    assert block_sizes(model_layout(cfg), 12345) == {LAYER_BLOCK: layer_bytes, FULL_BLOCK: mcfg.num_layers * layer_bytes,
                                                     "--block-mib": 12345}


def test_four_transfers_land_the_bytes_and_are_rated_against_memcpy(tmp_path):
    out, png = tmp_path / "t.json", tmp_path / "t.png"
    p = cli_here("bench", "transport", *SMALL, "--json", str(out), "--plot", str(png))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    want = ["memcpy", "shm", "tcp", "mooncake"] if mooncake_loads() else ["memcpy", "shm", "tcp"]
    assert r["transfers"] == want and set(r["rows"]) == set(want) and (r["model"], r["rounds"]) == ("tiny", 2)
    assert r["total_bytes"] % r["sizes"][FULL_BLOCK] == 0 and r["total_bytes"] <= 2**20
    for t, by_size in r["rows"].items():
        assert set(by_size) == {LAYER_BLOCK, FULL_BLOCK}
        for size, c in by_size.items():
            assert c["intact"], (t, size)  # the destination's checksum is the source's
            assert 0 < c["gbps_min"] <= c["gbps_median"] <= c["gbps_max"] and len(c["gbps_rounds"]) == 2
            assert 0 < c["latency_p50_us"] <= c["latency_p90_us"] and c["latency_samples"] == 2 * 4
            assert c["ratio_to_memcpy"] > 0 and c["num_blocks"] * c["block_bytes"] == r["total_bytes"]
            assert c["block_bytes"] == r["sizes"][size]
    assert all(c["ratio_to_memcpy"] == 1.0 for c in r["rows"]["memcpy"].values())
    if "mooncake" in r["rows"]:
        for d in r["mooncake_breakdown"].values():
            assert d["one_batch_gbps_median"] > 0 and d["sync_per_block_gbps_median"] > 0
            assert d["us_per_block"] == pytest.approx(d["bytes_us_per_block"] + d["per_call_us_per_block"]
                                                      + d["link_us_per_block"])
    assert "mooncake" in p.stdout and "shm" in p.stdout and "vs memcpy" in p.stdout
    assert png.stat().st_size > 0
    text = transport_table(r)  # what docs/results.md will show from the committed run
    assert all(TRANSPORT_LABELS[t] in text for t in want) and text.count("| yes |") == 2 * len(want)


def test_without_mooncake_its_row_is_one_skip_line_and_the_others_run(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "mooncake.engine", None)  # as if it were not installed: import fails
    out = tmp_path / "t.json"
    p = cli_here("bench", "transport", "--model", "tiny", "--total-mib", "1", "--rounds", "1", "--latency-blocks", "2",
                 "--json", str(out))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    r = json.loads(out.read_text())
    assert r["transfers"] == ["memcpy", "shm", "tcp"] and "mooncake_breakdown" not in r
    assert INSTALL_HINT in r["skipped"]["mooncake"]
    assert r["notes"] == [f"mooncake: skipped: {r['skipped']['mooncake']}"]
    assert "mooncake: skipped: transport.transfer mooncake needs Mooncake" in p.stdout.replace("\n", " ")
    assert all(c["intact"] and c["gbps_median"] > 0 for by_size in r["rows"].values() for c in by_size.values())


@pytest.mark.parametrize("args, needle", [
    (["--rounds", "0"], "must be >= 1"),
    (["--block-mib", "0"], "--block-mib positive"),
    (["--model", "tiny", "--total-mib", "1", "--block-mib", "2"], "holds no whole block"),
    (["--model", "no-such-model"], "bench transport takes a built-in model"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    p = cli_here("bench", "transport", *args)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr + p.stdout and "Traceback" not in p.stderr
