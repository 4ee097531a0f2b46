"""Rank 1 of a tensor-parallel engine: `python -m dualpath.runtime.model.tp_worker` (tp_launch.py
starts it). It loads the engine's model, keeps its halves of the MLPs (tensor_parallel.py), joins
rank 0's store and serves every forward's collectives until the stop header.

It never outlives rank 0: a parent-death signal (Linux prctl) ends it if rank 0 dies, and a
collective on a socket rank 0 closed fails at once. Exit codes: 0 after the stop header, 1 when
rank 0 went away, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import gc
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# How long rank 1 waits to reach rank 0's store (project choice: rank 0 is up before it starts us).
STORE_CONNECT_TIMEOUT_S = 30.0


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (and now, if it already has)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the closed socket still ends it at its next collective
    if os.getppid() != parent_pid:
        os._exit(1)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tp_worker")
    p.add_argument("--model", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--store", required=True, help="HOST:PORT of rank 0's TCPStore")
    p.add_argument("--host", required=True, help="this rank's address for its gloo sockets")
    p.add_argument("--parent-pid", type=int, required=True)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent(args.parent_pid)
    import torch
    import torch.distributed as dist

    from dualpath.runtime.model.loader import load_model
    from dualpath.runtime.model.tensor_parallel import Collectives, mlp_shards, open_group, serve_follower
    from dualpath.runtime.model.tp_launch import READY_KEY

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    model = load_model(args.model, dtype=dtype, seed=args.seed).model
    shards, hidden_size = mlp_shards(model, 1), model.config.hidden_size
    del model
    gc.collect()
    host, port = args.store.rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world_size=2, is_master=False,
                          timeout=datetime.timedelta(seconds=STORE_CONNECT_TIMEOUT_S))
    store.set(READY_KEY, "1")
    try:
        collectives = Collectives(open_group(store, 1, args.host))
        serve_follower(shards, collectives, hidden_size, dtype)
    except RuntimeError as e:  # rank 0 closed its sockets: it ended or died
        print(f"tp rank 1: rank 0 went away ({str(e).splitlines()[0]})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
