"""Spellings the CLI and the configs accept: P/D shapes, token counts, devices. Each a one-line
`InputError` naming the problem when malformed."""

from __future__ import annotations

import re

from .errors import InputError


_PD_RE = re.compile(r"^\s*(\d+)\s*[pP]\s*(\d+)\s*[dD]\s*$")


_DEVICE_RE = re.compile(r"^(cpu|cuda)(?::(\d+))?$")


def parse_device(text: str) -> tuple[str, int | None]:
    """'cpu' -> ('cpu', None); 'cuda' -> ('cuda', None); 'cuda:1' -> ('cuda', 1). Spelling only:
    whether the GPU exists is `runtime.device.require_device`'s question."""
    m = _DEVICE_RE.match(text.strip().lower()) if isinstance(text, str) else None
    if not m or (m.group(1) == "cpu" and m.group(2) is not None):
        raise InputError(f"unknown device {text!r}: expected cpu, cuda or cuda:N")
    return m.group(1), None if m.group(2) is None else int(m.group(2))


def parse_pd(text: str) -> tuple[int, int]:
    """'2P4D' -> (2, 4): prefill and decode node counts."""
    m = _PD_RE.match(text)
    if not m:
        raise InputError(f"malformed P/D shape {text!r}: expected e.g. 1P1D, 2P4D, 48P96D")
    p, d = int(m.group(1)), int(m.group(2))
    if p <= 0 or d <= 0:
        raise InputError(f"P/D shape {text!r} needs at least one prefill and one decode node")
    return p, d


def parse_tokens(text: str | int) -> int:
    """'64k' -> 65536, '32K' -> 32768, '4096' -> 4096."""
    if isinstance(text, int):
        value = text
    else:
        m = re.match(r"^\s*(\d+)\s*([kK]?)\s*$", str(text))
        if not m:
            raise InputError(f"malformed token count {text!r}: expected e.g. 64k or 32768")
        value = int(m.group(1)) * (1024 if m.group(2) else 1)
    if value <= 0:
        raise InputError(f"token count must be positive, got {text!r}")
    return value


def format_tokens(value: int) -> str:
    """65536 -> '64k', 4000 -> '4000': what parse_tokens reads back as the same count."""
    return f"{value // 1024}k" if value % 1024 == 0 else str(value)
