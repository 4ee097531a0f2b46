"""Control messages between engine processes, and their msgpack encoding.

A message is a frozen, slotted dataclass of msgpack-native fields (int, float, str, bytes, bool,
None, lists) registered with `@message`; on the wire it is `[type name, field values...]` in
declaration order. Bulk bytes never ride here: they move through shared memory (`shm`) or TCP.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

import msgpack

_TYPES: dict[str, type] = {}
M = TypeVar("M", bound=type)


def message(cls: M) -> M:
    """Register a dataclass as a control message (its class name is its wire tag)."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    if cls.__name__ in _TYPES and _TYPES[cls.__name__] is not cls:
        raise ValueError(f"message name {cls.__name__} is already registered")
    _TYPES[cls.__name__] = cls
    return cls


def encode(msg: Any) -> bytes:
    cls = type(msg)
    if _TYPES.get(cls.__name__) is not cls:
        raise TypeError(f"{cls.__name__} is not a registered message")
    return msgpack.packb([cls.__name__, *(getattr(msg, f.name) for f in dataclasses.fields(msg))], use_bin_type=True)


def decode(data: bytes) -> Any:
    tag, *values = msgpack.unpackb(data, raw=False)
    cls = _TYPES.get(tag)
    if cls is None:
        raise ValueError(f"unknown message type {tag!r}")
    return cls(*values)


@message
@dataclass(frozen=True, slots=True)
class Stop:
    """Ask a process's control loop to finish; `reason` is for logs."""

    reason: str
