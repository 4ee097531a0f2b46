"""Tensor-parallel engines in a cluster (config/tp.py): a 1P1D local cluster whose engines each run
two ranks (RuntimeConfig.tp) serves a conversation with the tokens of one rank per engine, and the
router's latency-critical ledger counts the collectives' bytes; bad `--tp` is one error line."""

import asyncio
import os
import time

import pytest

from cli_helpers import cli_here
from dualpath.config import EngineConfig, RuntimeConfig, TransportConfig
from dualpath.config.tp import TensorParallelConfig
from dualpath.errors import InputError
from test_kv_paths import TURNS, cluster_conversation, reference_conversation


def test_a_tp2_cluster_serves_the_tokens_of_tp1(monkeypatch):
    tag = _tag_children(monkeypatch)
    cfg = RuntimeConfig(model="tiny",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        tp=TensorParallelConfig(2))
    outs, cached, summary = asyncio.run(cluster_conversation(cfg))
    assert outs == reference_conversation("tiny")
    assert cached[0] == 0 and all(c > 0 for c in cached[1:])  # the KV paths still load the hits
    # every forward of both engines sends its MLP inputs and partials on the LC lane: at least
    # the PE's first turn, 2 collectives x 4 layers x its 200 tokens x hidden 64 x 4 bytes
    assert summary["bytes"]["cnic_lane_latency_critical"] >= 2 * 4 * len(TURNS[0]) * 64 * 4
    assert _tp_workers(tag) == []  # the engines stopped their rank 1s


def _tag_children(monkeypatch) -> bytes:
    """A mark in the environment every process this test starts inherits (engines take the
    cluster's environment, rank 1 its engine's), so that another test's rank 1s, running beside
    this one under xdist, are not counted as ours."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("DUALPATH_TEST_TAG", tag)
    return f"DUALPATH_TEST_TAG={tag}".encode()


def _tp_workers(tag: bytes) -> list[int]:
    """Live rank-1 processes started by this test (`tag`; zombies have ended)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{pid}/environ", "rb") as f:
                ours = tag in f.read().split(b"\0")
        except OSError:
            continue
        if b"dualpath.runtime.model.tp_worker" in cmd and state != "Z" and ours:
            found.append(int(pid))
    return found


def test_tp_must_be_1_or_2_and_cpu_only():
    with pytest.raises(InputError, match="tp must be 1 or 2"):
        TensorParallelConfig(4)
    with pytest.raises(InputError, match="gloo on the cpu"):
        RuntimeConfig(device="cuda", tp=TensorParallelConfig(2))
    for args in (("serve", "--tp", "3"), ("demo", "--tp", "0"), ("demo", "--tp", "2", "--testbed", "--ray")):
        r = cli_here(*args)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error:"), (args, r.stderr)


@pytest.mark.slow  # 25 s; the local cluster above covers the engines' tp path by default
def test_a_joined_decode_engine_with_tp2_serves_the_tokens_of_tp1(tmp_path, monkeypatch):
    """`dualpath engine --tp 2`: the tensor-parallel ranks are the joining host's business (a local
    override of the router's config); the decode engine's rank 1 binds to its --listen address."""
    tag = _tag_children(monkeypatch)
    from test_joined_engines import _engine

    token = tmp_path / "token"
    token.write_text("the cluster's secret\n")
    cfg = RuntimeConfig(model="tiny",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        transport=TransportConfig(kind="tcp", peer_token_file=str(token)))
    engines = []

    def start(router: str) -> None:
        engines.extend([_engine(router, "prefill", token), _engine(router, "decode", token, "--tp", "2")])

    try:
        outs, _, summary = asyncio.run(cluster_conversation(cfg, engines_listen="tcp://127.0.0.1:0", on_router_ready=start))
        assert outs == reference_conversation("tiny")
        assert summary["bytes"]["cnic_lane_latency_critical"] > 0  # only the DE's collectives count there
        for p in engines:
            assert p.wait(timeout=30) == 0
    finally:
        for p in engines:
            if p.poll() is None:
                p.kill()
    assert _tp_workers(tag) == []
