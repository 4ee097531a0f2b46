"""`--ray` bad input, in process: one `error:` line, exit 2, quickly, and no Ray left running.
Ray missing is faked (the message tells the user what to install); an unreachable address needs
Ray importable (it is refused by the TCP probe before Ray starts anything)."""

import socket
import sys
import time

import pytest

from cli_helpers import cli_here

SPEC = "model: ds-27b\nmax_len: 32k\nagents: 16\nmode: basic\n"


def _one_error_line(r, *words):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert all(w in lines[0] for w in words), lines[0]


@pytest.fixture
def spec(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(SPEC)
    return p


@pytest.mark.parametrize("command", ["sweep", "repro", "sim"])
def test_ray_missing_tells_what_to_install(monkeypatch, tmp_path, spec, command):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    args = {"sweep": ["sweep", str(spec), "--out", str(tmp_path / "o")], "repro": ["repro", "--only", "table1", "--out", str(tmp_path / "o")],
            "sim": ["sim", "--model", "ds-27b", "--max-len", "32k", "--agents", "8"]}[command]
    _one_error_line(cli_here(*args, "--ray", "local"), "pip install 'dualpath[cluster]'")
    assert not (tmp_path / "o" / "sweep.csv").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_address_exits_2_quickly_with_nothing_running(tmp_path, spec):
    ray = pytest.importorskip("ray", reason="Ray is the optional `cluster` extra: pip install 'dualpath[cluster]'")
    address = f"127.0.0.1:{_free_port()}"
    t0 = time.monotonic()
    r = cli_here("sweep", str(spec), "--out", str(tmp_path / "o"), "--ray", address)
    assert time.monotonic() - t0 < 3.0  # a refused connect; an address that does not answer waits 5 s at most
    _one_error_line(r, address, "cannot reach")
    assert not ray.is_initialized()


@pytest.mark.parametrize("args, words", [
    (["--ray", "nonsense"], ["'nonsense'", "HOST:PORT"]),
    (["--ray", "host:99999"], ["HOST:PORT"]),
    (["--workers", "0"], ["--workers must be at least 1"]),
])
def test_malformed_ray_options(tmp_path, spec, args, words):
    pytest.importorskip("ray", reason="Ray is the optional `cluster` extra: pip install 'dualpath[cluster]'")
    _one_error_line(cli_here("sweep", str(spec), "--out", str(tmp_path / "o"), *args), *words)


def test_sim_ray_refuses_options_that_need_this_process(tmp_path):
    r = cli_here("sim", "--model", "ds-27b", "--max-len", "32k", "--agents", "8", "--ray", "local",
                 "--turns", str(tmp_path / "t.csv"))
    _one_error_line(r, "--turns", "--ray")


def test_the_single_host_commands_do_not_import_ray(tmp_path, spec):
    import subprocess

    code = ("import sys; from dualpath.cli.main import app; from dualpath.errors import run_cli; "
            f"sys.argv = ['dualpath', 'sweep', {str(spec)!r}, '--out', {str(tmp_path / 'o')!r}]\n"
            "try:\n    run_cli(app)\nexcept SystemExit:\n    pass\n"
            "print('ray' in sys.modules, 'dualpath.deploy.ray.pool' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "False False", r.stdout + r.stderr
    assert (tmp_path / "o" / "sweep.csv").read_text().count("\n") == 2  # it ran: a header and one row
    assert (tmp_path / "o" / "sweep.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_port_that_answers_but_is_no_ray_head_is_refused_within_the_preflight_bound():
    """An HTTP server on loopback: Ray's own join retried for 206 s; the pre-flight child is
    killed or fails within PREFLIGHT_TIMEOUT_S (measured: 13 s)."""
    pytest.importorskip("ray")
    import http.server
    import threading

    from dualpath.deploy.ray.pool import PREFLIGHT_TIMEOUT_S

    srv = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        t0 = time.monotonic()
        r = cli_here("sim", "--model", "ds-27b", "--max-len", "32k", "--agents", "4", "--ray", f"127.0.0.1:{srv.server_port}")
        took = time.monotonic() - t0
    finally:
        srv.shutdown()
    _one_error_line(r, f"127.0.0.1:{srv.server_port}")
    assert took < PREFLIGHT_TIMEOUT_S + 10
