"""The Ray executor: each call of a batch one Ray task; how `--ray ADDRESS` connects.

`--ray ADDRESS`:
- `local`: start a Ray cluster on this machine with `--workers` CPUs (default: every core), used
  for this command only and stopped when it ends;
- `auto`: join the cluster `ray start` left running on this machine (Ray's own lookup);
- `HOST:PORT` (or `ray://HOST:PORT`, Ray Client): join that cluster's head.

Ray's `ray.init(address=...)` on an address where no head answers does not fail: it retries
without end (measured with 2.60.0: still waiting after 200 s). So a remote address is first
probed with a plain TCP connect, bounded by `CONNECT_TIMEOUT_S`; one that refuses or does not
answer is an InputError before Ray starts anything. A port that accepts but is no Ray head (an
HTTP server on loopback kept `ray.init` retrying for 206 s even with Ray's GCS waits bounded by
`_BOUNDED_CONNECT`) is caught by a pre-flight: a child process joins and leaves the cluster first,
killed after `PREFLIGHT_TIMEOUT_S`; only then does this process join.

The workers must import the same `dualpath` (the local cluster inherits this process's
environment; on a remote cluster install the same commit on every node): each task returns its
code identity (the caller's `identity`, e.g. the simulator's code fingerprint), and a mismatch is
refused, since cached results are keyed by it.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from typing import Any, Callable, Iterator, Sequence

from ...errors import InputError

OnDone = Callable[[int, Any], None]  # (index into the batch, result), as executor.OnDone

CONNECT_TIMEOUT_S = 5.0  # project choice: a reachable head answers a TCP connect within milliseconds
# project choice: a live head on this machine was joined (Ray imported, connected, left) in a few
# seconds; Ray's own retries against a non-Ray port ran for minutes
PREFLIGHT_TIMEOUT_S = 30.0
_PREFLIGHT = ("import sys, ray; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False, "
              "configure_logging=True); ray.shutdown()")
# Ray's GCS waits while joining a cluster (env names from ray 2.60.0's ray_config_def.h and
# _private/node.py); Ray's defaults retry for minutes. Set only where the user has not.
_BOUNDED_CONNECT = {
    "RAY_gcs_server_port_wait_time_s": "5",
    "RAY_gcs_rpc_server_connect_timeout_s": "3",
    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
}
# A local cluster's object store: results are JSON dicts of some KB to a few MB; Ray's default
# (30% of RAM) is far more than a sweep needs on a shared machine. Ray's minimum is 75 MiB.
LOCAL_OBJECT_STORE_BYTES = 256 * 2**20
INSTALL_HINT = "pip install 'dualpath[cluster]'"


def _no_identity() -> str:
    return ""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError(f"--ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    return ray


def parse_address(address: str) -> tuple[str, int]:
    """HOST:PORT (a `ray://` prefix allowed) -> (host, port); anything else is an InputError."""
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise InputError(f"--ray {address!r}: expected local, auto or HOST:PORT (e.g. 10.0.0.1:6379)")
    return host.strip("[]"), int(port)


def probe(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """A TCP connect to the head, or an InputError naming the address and why."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as e:
        why = "no answer" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
        raise InputError(f"--ray {address}: cannot reach a Ray head there within {timeout_s:g} s ({why})") from None


def preflight(address: str, target: str, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
    """Join and leave the cluster at `target` from a child process, or an InputError; the child is
    killed when it takes longer than `timeout_s` (Ray retries without end against a non-Ray port)."""
    try:
        p = subprocess.run([sys.executable, "-c", _PREFLIGHT, target], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise InputError(f"--ray {address}: no Ray head answered at {target} within {timeout_s:g} s") from None
    if p.returncode != 0:
        if "InvalidAuthToken" in p.stderr:  # Ray >= 2.52 heads started by `ray start` require their token
            raise InputError(f"--ray {address}: the cluster at {target} wants its auth token: set RAY_AUTH_MODE=token "
                             "(the token from ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN)")
        last = (p.stderr.strip().splitlines() or ["exit code %d" % p.returncode])[-1]
        raise InputError(f"--ray {address}: no Ray head answers at {target} ({last[:200]})")


def _auto_address(ray: Any) -> str:
    """The address `ray.init(address="auto")` would join (Ray's lookup), or an InputError."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        found = canonicalize_bootstrap_address("auto")
    except (ConnectionError, ValueError) as e:
        raise InputError(f"--ray auto: no running Ray cluster found on this machine ({e})") from None
    if not found:
        raise InputError("--ray auto: no running Ray cluster found on this machine (start one with `ray start --head`)")
    return found


def _init(ray: Any, address: str, num_workers: int | None) -> None:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # Ray would report usage over the internet
    common = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR", "configure_logging": True}
    if address == "local":
        if num_workers is not None and num_workers <= 0:
            raise InputError(f"--workers must be positive, got {num_workers}")
        ray.init(num_cpus=num_workers or os.cpu_count() or 1, object_store_memory=LOCAL_OBJECT_STORE_BYTES, **common)
        return
    if num_workers is not None:
        raise InputError("--workers sets the size of a local cluster (--ray local); a running cluster has its own")
    target = _auto_address(ray) if address == "auto" else address
    probe(target)
    for k, v in _BOUNDED_CONNECT.items():
        os.environ.setdefault(k, v)
    preflight(address, address if address.startswith("ray://") else target)
    common.pop("include_dashboard")  # only for a cluster this process starts
    try:
        with _quiet_stderr():  # Ray's C++ client logs a warning per retry: the one error line would drown
            ray.init(address=address if address.startswith("ray://") else target, **common)
    except (ConnectionError, RuntimeError) as e:  # it answered TCP but is no Ray head (or a different Ray)
        raise InputError(f"--ray {address}: no Ray head answers at {target} ({' '.join(str(e).split())[:200]})") from None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """File descriptor 2 to /dev/null for the block (the C++ logs bypass sys.stderr)."""

    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextlib.contextmanager
def ray_session(address: str, num_workers: int | None = None,
                identity: Callable[[], str] = _no_identity) -> Iterator["RayExecutor"]:
    """A Ray executor for the block; Ray is shut down after it (a local cluster's processes end)."""
    ray = _import_ray()
    if address not in ("local", "auto"):
        parse_address(address)  # a malformed address is an error before anything starts
    if ray.is_initialized():  # not ours to shut down afterwards
        raise InputError("Ray is already initialised in this process: use RayExecutor(ray) directly")
    try:
        _init(ray, address, num_workers)
        yield RayExecutor(ray, identity)
    finally:
        if ray.is_initialized():  # also after a failed init: a local cluster's processes end here
            ray.shutdown()


def _call(identity: Callable[[], str], fn: Callable[..., Any], args: tuple[Any, ...]) -> tuple[str, Any]:
    """The task body: the worker's code identity beside the result."""
    return identity(), fn(*args)


class RayExecutor:
    parallel = True

    def __init__(self, ray: Any, identity: Callable[[], str] = _no_identity) -> None:
        self.ray = ray
        self.identity = identity  # e.g. the simulator's code fingerprint: workers must match it
        self.num_workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._task = ray.remote(num_cpus=1)(_call)

    def starting(self) -> None:
        pass

    def map(self, fn: Callable[..., Any], args: Sequence[tuple[Any, ...]], on_done: OnDone) -> None:
        mine = self.identity()
        pending = {self._task.remote(self.identity, fn, a): i for i, a in enumerate(args)}
        try:
            while pending:
                done, _ = self.ray.wait(list(pending), num_returns=1)
                for ref in done:
                    i = pending.pop(ref)
                    theirs, result = self.ray.get(ref)
                    if theirs != mine:
                        raise InputError(f"a Ray worker runs other code (identity {theirs}, here {mine}): "
                                         "install the same dualpath on every node")
                    on_done(i, result)
        finally:
            for ref in pending:  # an error or Ctrl-C: the rest of the batch is not wanted
                self.ray.cancel(ref, force=True)
