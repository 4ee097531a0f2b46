"""Zero-copy byte views of caller buffers (bytes-likes, numpy arrays, CPU torch tensors).

torch is never imported here: a tensor is recognised by its module and viewed through
`Tensor.numpy()`, which shares the tensor's memory (pinned host memory included).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dualpath.core.blocks import BlockLayout
from dualpath.runtime.store.errors import OutputBufferError, PayloadSizeError
from dualpath.runtime.store.format import DIGEST_BYTES


def _untorch(obj: Any, writable: bool) -> Any:
    if type(obj).__module__.split(".")[0] != "torch":
        return obj
    import torch  # only reached when the caller already uses torch

    if obj.device.type != "cpu":
        raise OutputBufferError(f"tensor on {obj.device}; the store reads into host memory")
    if writable and not obj.is_contiguous():
        raise OutputBufferError("output tensor is not contiguous")
    return obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()


def byte_view(obj: Any, *, writable: bool) -> memoryview:
    """A flat unsigned-byte memoryview of `obj` sharing its memory. A writable view must be
    C-contiguous (OutputBufferError otherwise); a read-only one of a strided source is a copy."""
    obj = _untorch(obj, writable)
    if isinstance(obj, np.ndarray):
        if not obj.flags.c_contiguous:
            if writable:
                raise OutputBufferError("output array is not C-contiguous")
            obj = np.ascontiguousarray(obj)
        obj = obj.reshape(-1).view(np.uint8)
    try:
        mv = memoryview(obj)
    except TypeError as exc:
        raise OutputBufferError(f"{type(obj).__name__} does not expose a buffer") from exc
    if writable and mv.readonly:
        raise OutputBufferError("output buffer is read-only")
    if not mv.c_contiguous:
        if writable:
            raise OutputBufferError("output buffer is not C-contiguous")
        mv = memoryview(mv.tobytes())
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def address_of(mv: memoryview) -> int:
    """Start address of a writable byte view (for O_DIRECT alignment checks)."""
    return np.frombuffer(mv, dtype=np.uint8).ctypes.data if len(mv) else 0


def block_payload(digest: bytes, payload: Any, layout: BlockLayout) -> memoryview:
    """A read-only byte view of one Full Block's payload, after checking the digest's and the
    payload's sizes (ValueError, PayloadSizeError)."""
    if len(digest) != DIGEST_BYTES:
        raise ValueError(f"digest must be {DIGEST_BYTES} bytes, got {len(digest)}")
    view = byte_view(payload, writable=False)
    if len(view) != layout.full_block_bytes:
        raise PayloadSizeError(f"payload has {len(view)} bytes, a Full Block has {layout.full_block_bytes} ({layout})")
    return view
