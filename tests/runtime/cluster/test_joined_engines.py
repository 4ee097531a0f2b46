"""Engines started on their own (`dualpath engine`), joining a router over the network, as on
separate hosts (loopback here; engine/join.py, cluster.py `engines_listen`): they get the
recompute's tokens; a third engine finds no free place and says so; one without the token gets
no answer and says so (exit code 2, one line each)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from dualpath.config import EngineConfig, RuntimeConfig, TransportConfig
from dualpath.runtime.transport.mooncake import MooncakeAddress, mooncake_loads
from test_kv_paths import DEVICE, cluster_conversation, reference_conversation


def _engine(router: str, role: str, token_file, *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "dualpath.cli", "engine", "--router", router, "--role", role, *extra]
    if token_file is not None:
        args += ["--token-file", str(token_file)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_engines_join_over_the_network_and_strangers_are_told_why_not(tmp_path):
    token, wrong = tmp_path / "token", tmp_path / "wrong"
    token.write_text("the cluster's secret\n")
    wrong.write_text("not the cluster's secret\n")
    cfg = RuntimeConfig(model="tiny", mode="dualpath", force_read_side="decode",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        transport=TransportConfig(kind="tcp", peer_token_file=str(token)), device=DEVICE)
    engines: list[subprocess.Popen] = []
    strangers: list[subprocess.Popen] = []

    def start_engines(router: str) -> None:  # once the router has bound its port (no race for it)
        # two prefill engines for one place: whichever joins first serves, the other is refused
        # (started together: on a loaded machine either may finish its imports first)
        engines.extend([_engine(router, "prefill", token), _engine(router, "prefill", token),
                        _engine(router, "decode", token)])
        strangers.append(_engine(router, "decode", wrong, "--join-timeout-s", "3"))

    try:
        outs, _, summary = asyncio.run(cluster_conversation(cfg, engines_listen="tcp://127.0.0.1:0",
                                                            on_router_ready=start_engines))
        assert outs == reference_conversation("tiny")
        assert summary["bytes"]["remote_writes"] > 0 and summary["bytes"]["storage_via_decode"] > 0
        ended = [(p, *p.communicate(timeout=60)) for p in engines]
        served = [(p, out, err) for p, out, err in ended if p.returncode == 0]
        refused = [(p, out, err) for p, out, err in ended if p.returncode != 0]
        assert len(served) == 2 and all("joined " in out for _, out, _ in served), [e for _, _, e in ended]
        (late, _, late_err), = refused  # the cluster's Stop ended the others cleanly
        assert late.returncode == 2 and "every prefill place of 1P1D is taken" in late_err
        (stranger,) = strangers
        stranger_err = stranger.communicate(timeout=60)[1]
        assert stranger.returncode == 2 and "no answer from the router" in stranger_err and "token" in stranger_err
        assert "Traceback" not in late_err + stranger_err
    finally:
        for p in [*engines, *strangers]:
            if p.poll() is None:
                p.kill()


def test_bad_engine_arguments_are_one_line_errors():
    """Checked before anything is sent: no role, no tcp:// router, a router beyond loopback without
    a token (nothing leaves this machine)."""
    from cli_helpers import cli_here

    for args, needle in ((("--role", "bogus", "--router", "tcp://127.0.0.1:1"), "--role must be prefill or decode"),
                         (("--role", "prefill", "--router", "http://x:1"), "--router must be tcp://HOST:PORT"),
                         (("--role", "decode", "--router", "tcp://10.9.9.9:1"), "needs a shared token")):
        p = cli_here("engine", *args)
        assert p.returncode == 2 and needle in p.stderr and "Traceback" not in p.stderr, (args, p.stderr)


@pytest.mark.skipif(not mooncake_loads(), reason="Mooncake Transfer Engine does not load: pip install "
                    "'dualpath[mooncake]' and apt-get install libibverbs1 librdmacm1 libnuma1")
def test_joined_engines_move_the_kv_through_mooncake_when_the_router_says_so(tmp_path):
    """transport.transfer comes with the cluster's config in the Welcome: each joined engine starts its
    own Mooncake engine and reports its address in its Hello; the tokens are the recompute's."""
    token = tmp_path / "token"
    token.write_text("the cluster's secret\n")
    cfg = RuntimeConfig(model="tiny", mode="dualpath", force_read_side="decode",
                        engines=EngineConfig(host_buffer_bytes=32 * 2**20, pe_hbm_bytes=32 * 2**20, de_kv_tokens=4096),
                        transport=TransportConfig(kind="tcp", peer_token_file=str(token), transfer="mooncake"), device=DEVICE)
    engines: list[subprocess.Popen] = []
    data: list[str] = []
    try:
        outs, _, summary = asyncio.run(cluster_conversation(
            cfg, data_endpoints=data, engines_listen="tcp://127.0.0.1:0",
            on_router_ready=lambda router: engines.extend(_engine(router, role, token) for role in ("prefill", "decode"))))
        assert outs == reference_conversation("tiny")
        assert summary["bytes"]["remote_writes"] > 0 and summary["bytes"]["storage_via_decode"] > 0
        assert sorted(len(MooncakeAddress.from_text(d).segments) for d in data) == [1, 2]  # DE: buffer; PE: + landing
        ended = [(p, *p.communicate(timeout=60)) for p in engines]  # the cluster's Stop ended them cleanly
        assert all(p.returncode == 0 and "joined " in out for p, out, _ in ended), [err[-2000:] for _, _, err in ended]
    finally:
        for p in engines:
            if p.poll() is None:
                p.kill()
