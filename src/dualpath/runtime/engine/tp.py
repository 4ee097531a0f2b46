"""An engine's second tensor-parallel rank (RuntimeConfig.tp): started after the model loads,
stopped when the engine closes (runtime/model/tp_launch.py has the lifecycle)."""

from __future__ import annotations

from ...config import RuntimeConfig
from ...errors import InputError
from ..model.llama import Llama
from ..model.tp_launch import TensorParallelError, TensorParallelRank0, TpPlacement, start_tensor_parallel


def start_engine_tp(model: Llama, cfg: RuntimeConfig, threads: int) -> TensorParallelRank0 | None:
    """Rank 1 for this engine's model when cfg.tp.ranks == 2 (None for one rank); a rank 1 that
    does not join is an InputError saying why, as for any engine that cannot start."""
    tp = cfg.tp
    if tp.ranks == 1:
        return None
    placement = TpPlacement(tp.leader_host, tp.follower_host, tp.follower_prefix)
    try:
        return start_tensor_parallel(model, cfg.model, cfg.seed, threads, placement, tp.rendezvous_timeout_s)
    except (TensorParallelError, ValueError) as exc:
        raise InputError(f"tp=2: {exc}") from None


def tp_payload_bytes(rank0: TensorParallelRank0 | None) -> int:
    """Bytes the collectives carried so far (0 without tensor parallelism)."""
    return 0 if rank0 is None else rank0.collectives.payload_bytes
