"""`dualpath bench checksum` and `bench remote-write`: their JSON (the shape the docs blocks read,
docs/results/checksum/checksum.json and transport/remote_write.json), the bytes the remote ways
landed checked inside the run, and bad input as one line with exit 2."""

from __future__ import annotations

import json

import pytest

from cli_helpers import cli_here

from dualpath.bench.checksum import SIZES


def test_checksum_bench_rates_every_installed_function_at_every_size(tmp_path):
    out = tmp_path / "c.json"
    p = cli_here("bench", "checksum", "--seconds", "0.03", "--json", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert "zlib.crc32" in r["gbps"] and r["winner"] in r["gbps"]
    assert r["sizes_bytes"] == SIZES
    assert all(set(row) == set(SIZES) and all(v > 0 for v in row.values()) for row in r["gbps"].values())
    assert r["winner"] in p.stdout


def test_remote_write_bench_times_four_ways_and_lands_the_bytes(tmp_path):
    out = tmp_path / "r.json"
    p = cli_here("bench", "remote-write", "--total-mib", "8", "--chunk-mib", "1", "--region-mib", "4",
                 "--repeat", "1", "--json", str(out))
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    assert list(r["rows"]) == ["memcpy", "memcpy + arbiter", "remote", "remote + arbiter"]
    assert (r["total_bytes"], r["chunk_bytes"], r["region_bytes"], r["repeat"]) == (8 << 20, 1 << 20, 4 << 20, 1)
    for row in r["rows"].values():
        assert row["seconds"] > 0 and row["gb_per_s"] == pytest.approx(r["total_bytes"] / row["seconds"] / 1e9)


@pytest.mark.parametrize("args, needle", [
    (["checksum", "--seconds", "0"], "--seconds must be positive"),
    (["remote-write", "--chunk-mib", "8", "--region-mib", "4"], "--chunk-mib at most --region-mib"),
    (["remote-write", "--repeat", "0"], "must be positive"),
])
def test_bad_input_is_one_line_and_exit_2(args, needle):
    p = cli_here("bench", *args)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr + p.stdout and "Traceback" not in p.stderr
