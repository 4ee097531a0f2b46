"""`dualpath serve --ray` bad input: one `error:` line, exit 2, before the server starts, and
nothing left running (no raylet, no engine). An unreachable address is refused by the TCP probe
before Ray starts anything; a cluster with no node for a role, or fewer CPUs than engines, is
refused at once instead of after the placement timeout (deploy/ray/engines.py)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from pathlib import Path

import pytest

from cli_helpers import cli, cli_here
from dualpath.config import RuntimeConfig
from dualpath.errors import InputError
from dualpath.deploy.ray.engines import bundles_for


def _one_error_line(r, *words: str) -> None:
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr[-3000:]
    assert all(w in lines[0] for w in words), lines[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_marked(mark: str) -> list[str]:
    """Command lines of the live processes whose environment holds `mark` (children inherit it)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if mark.encode() in (d / "environ").read_bytes():
                out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue  # gone, or not ours to read
    return out


def test_an_unreachable_ray_address_is_one_line_and_starts_nothing():
    ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
    address = f"127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    r = cli_here("serve", "--model", "tiny", "--ray", address, "--port", str(_free_port()))
    assert time.monotonic() - t0 < 8.0  # a refused connect: no model load, no server
    _one_error_line(r, address, "cannot reach a Ray head")
    assert not ray.is_initialized()


def test_demo_ray_needs_the_testbed():
    _one_error_line(cli_here("demo", "--model", "tiny", "--ray"), "demo --ray", "--testbed")


def test_a_cluster_without_a_role_or_with_too_few_cpus_is_refused_at_once():
    cfg = RuntimeConfig(model="tiny", num_prefill=1, num_decode=2)
    with pytest.raises(InputError, match=r"no node for the decode role: nodes declare dp_prefill but none dp_decode"):
        bundles_for(cfg, {"CPU": 8, "dp_prefill": 1})
    with pytest.raises(InputError, match=r"no node for the prefill role"):
        bundles_for(cfg, {"CPU": 8, "dp_decode": 2})
    with pytest.raises(InputError, match=r"cannot place 1P2D: it has 2 CPU\(s\) in all, and each of the 3 engines needs one"):
        bundles_for(cfg, {"CPU": 2})


@pytest.mark.slow
def test_more_engines_than_a_local_ray_can_place_is_one_line_with_nothing_left():
    """A real local Ray (this machine's cores) asked for more engines than it has CPUs: refused
    before the server starts; Ray's processes and any engine end with the command."""
    pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
    mark = f"DP_TEST_MARK={uuid.uuid4().hex}"
    n = (os.cpu_count() or 1) + 1
    r = cli("serve", "--model", "tiny", "--pd", f"{n}P1D", "--ray", "local", "--port", str(_free_port()),
            env={mark.split("=")[0]: mark.split("=")[1]}, timeout=180)
    _one_error_line(r, f"cannot place {n}P1D", "CPU(s) in all")
    deadline = time.monotonic() + 10  # Ray's processes end as ray.shutdown returns; give stragglers a moment
    while _processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _processes_marked(mark) == []


def test_run_with_an_unreachable_ray_address_is_one_line_and_starts_nothing(tmp_path):
    ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra")
    traj = tmp_path / "t.jsonl"
    assert cli_here("trace", "gen", "--max-len", "4k", "--agents", "1", "-o", str(traj)).returncode == 0
    address = f"127.0.0.1:{_free_port()}"
    _one_error_line(cli_here("run", str(traj), "--model", "tiny", "--ray", address), address, "cannot reach a Ray head")
    assert not ray.is_initialized()
    _one_error_line(cli_here("run", str(traj), "--testbed", "--snic-mb-s", "5", "--ray", "local"), "--testbed --ray",
                    "demo --testbed --ray")
