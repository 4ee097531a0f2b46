"""Record: value equality, hash and repr over `_key()`, for the small read-only records the
scheduler builds on every pass, request or forward (core/snapshot.py, core/request.py).

They are slotted classes with Final attributes rather than frozen dataclasses: under mypyc a frozen
dataclass's generated `__init__` stays Python code (it sets each field through
`object.__setattr__`), about 14 times the cost of a native constructor (a three-field class built a
million times in a loop compiled with mypyc: 0.34 s against 0.025 s on this project's 2-core
machine). A subclass lists its `__slots__`, sets them in `__init__` and returns them from `_key`.
"""

from __future__ import annotations

from typing import Any


class Record:
    __slots__ = ()

    def _key(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._key() == other._key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"{type(self).__name__}{self._key()!r}"
