"""Where an engine's model and KV cache live: the CPU or a CUDA GPU.

`RuntimeConfig.device` is one of
- `cpu` (the default; what CI runs);
- `cuda`: engine e on GPU e mod the number of visible GPUs, so one engine per GPU when there are
  enough, as in the paper's deployment (docs/paper.md §1.2: one engine per GPU, 8 per node);
- `cuda:N`: every engine on GPU N.
The spelling is checked when the config is built (`config.parse_device`); whether the GPU exists
is checked here, once, before any engine process starts, so a missing GPU is one clear error
instead of a traceback in every spawned engine.

What moves across the device boundary (docs/paper.md §1.3, the CNIC-centric copies):
- PE: the cached KV arrives in host memory (the landing zone) and is copied to the GPU layer by
  layer inside `Llama.prefill_layer`; each layer's new KV is copied back to host bytes
  (`layer_kv_to_bytes`) to go to the DE buffer.
- DE: the prompt's KV goes host -> KV cache and every full block KV cache -> host for the store,
  both as `SpanCopy` chunks on the CNIC arbiter's thread (`transport.transfer._copy`).
"""

from __future__ import annotations

import torch

from ...config import parse_device
from ...errors import InputError


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def require_device(spec: str, num_gpus: int | None = None) -> None:
    """Raise InputError unless `spec` names a device this process can use."""
    kind, index = parse_device(spec)
    if kind == "cpu":
        return
    n = visible_gpus() if num_gpus is None else num_gpus
    if n == 0:
        raise InputError(f"device {spec!r}: no CUDA GPU is visible to PyTorch {torch.__version__} "
                         "(torch.cuda.is_available() is False); use --device cpu")
    if index is not None and index >= n:
        raise InputError(f"device {spec!r}: only {n} CUDA GPU(s) visible (cuda:0 to cuda:{n - 1})")


def engine_device(spec: str, engine: int, num_gpus: int) -> str:
    """The torch device string for engine `engine` (0-based over prefill then decode engines)."""
    kind, index = parse_device(spec)
    if kind == "cpu":
        return "cpu"
    if index is not None:
        return f"cuda:{index}"
    if num_gpus <= 0:
        raise InputError(f"device {spec!r}: no CUDA GPU is visible")
    return f"cuda:{engine % num_gpus}"
