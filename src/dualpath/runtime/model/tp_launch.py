"""Rank 0's side of a tensor-parallel engine: start rank 1, meet it, install the MLP hooks, stop it.

Lifecycle (tensor_parallel.py has the per-layer protocol):
  1. `start_tensor_parallel` opens a TCPStore on rank 0's address (port 0: the kernel picks one)
     and starts rank 1 (`python -m dualpath.runtime.model.tp_worker`) as a child process, behind
     `TpPlacement.follower_prefix` (e.g. `ip netns exec NS` on the testbed).
  2. Rank 1 loads the same model, keeps its MLP halves, sets the store key `follower_ready`.
     Rank 0 polls the key and the child: a child that exits, or a key not set within
     `rendezvous_timeout_s`, is a `TensorParallelError` naming what happened (the child is killed).
  3. Both build the gloo group (sockets on their own addresses); rank 0 installs `LeaderMlp` hooks.
  4. `close()`: the stop header, then the child's exit (killed if it does not exit in time). If rank
     0 dies instead, rank 1's collective fails on the closed socket, and its parent-death signal
     (tp_worker.py) ends it even while it loads: no orphan either way.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO

import torch.distributed as dist

from dualpath.runtime.model.llama import Llama
from dualpath.runtime.model.tensor_parallel import (Collectives, check_splittable, install_leader, open_group,
                                                    stop_follower, uninstall)

READY_KEY = "follower_ready"
READY_POLL_S = 0.05  # how often rank 0 looks at the key and the child while it waits (project choice)
# Rank 1's exit after the stop header: it only returns from its loop and exits (project choice).
FOLLOWER_EXIT_WAIT_S = 10.0


class TensorParallelError(RuntimeError):
    """Rank 1 did not start or join."""


@dataclass(frozen=True, slots=True)
class TpPlacement:
    """Where the two ranks sit: each binds its gloo sockets to its own address."""

    leader_host: str = "127.0.0.1"  # rank 0's address: the store and its gloo sockets
    follower_host: str = "127.0.0.1"  # rank 1's address
    follower_prefix: tuple[str, ...] = ()  # argv before python for rank 1, e.g. ("ip", "netns", "exec", NS)


class TensorParallelRank0:
    """A running pair, seen from rank 0: its collectives (bytes carried) and rank 1's process."""

    def __init__(self, model: Llama, collectives: Collectives, follower: subprocess.Popen, store: dist.Store) -> None:
        # the store's server lives in this process: kept as long as the group that met through it
        self.model, self.collectives, self.follower, self._store = model, collectives, follower, store
        self._closed = False

    @property
    def follower_pid(self) -> int:
        return self.follower.pid

    def close(self) -> int | None:
        """Stop rank 1 and wait for it; returns its exit code (None if it had to be killed)."""
        if self._closed:
            return self.follower.returncode
        self._closed = True
        uninstall(self.model)
        try:
            if self.follower.poll() is None:
                stop_follower(self.collectives)
            return self.follower.wait(FOLLOWER_EXIT_WAIT_S)
        except (RuntimeError, subprocess.TimeoutExpired):
            self.follower.kill()
            self.follower.wait()
            return None


def follower_argv(model_name: str, seed: int, dtype: str, threads: int, store_addr: str,
                  placement: TpPlacement) -> list[str]:
    return [*placement.follower_prefix, sys.executable, "-m", "dualpath.runtime.model.tp_worker",
            "--model", model_name, "--seed", str(seed), "--dtype", dtype, "--threads", str(threads),
            "--store", store_addr, "--host", placement.follower_host, "--parent-pid", str(os.getpid())]


def start_tensor_parallel(model: Llama, model_name: str, seed: int, threads: int, placement: TpPlacement,
                          rendezvous_timeout_s: float) -> TensorParallelRank0:
    """Start rank 1 for `model` (loaded from `model_name`, `seed`), meet it, install the hooks."""
    check_splittable(model.config.intermediate_size)
    timeout = datetime.timedelta(seconds=rendezvous_timeout_s)
    store = dist.TCPStore(placement.leader_host, 0, world_size=2, is_master=True, timeout=timeout,
                          wait_for_workers=False)
    dtype = str(model.dtype).removeprefix("torch.")
    argv = follower_argv(model_name, seed, dtype, threads, f"{placement.leader_host}:{store.port}", placement)
    with tempfile.TemporaryFile("w+") as log:  # rank 1's stderr, read back if it fails to join
        follower = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stderr=log)
        try:
            _wait_ready(store, follower, log, rendezvous_timeout_s)
            collectives = Collectives(open_group(store, 0, placement.leader_host))
        except BaseException:
            follower.kill()
            follower.wait()
            raise
    install_leader(model, collectives)
    return TensorParallelRank0(model, collectives, follower, store)


def _wait_ready(store: dist.Store, follower: subprocess.Popen, log: IO[str], timeout_s: float) -> None:
    deadline_s = time.monotonic() + timeout_s
    while not store.check([READY_KEY]):
        code = follower.poll()
        if code is not None:
            log.seek(0)
            last = log.read().strip().splitlines()[-1:] or ["(no output)"]
            raise TensorParallelError(f"tensor-parallel rank 1 exited with code {code} before joining: {last[0]}")
        if time.monotonic() > deadline_s:
            raise TensorParallelError(f"tensor-parallel rank 1 did not join within {timeout_s:g} s")
        time.sleep(READY_POLL_S)
