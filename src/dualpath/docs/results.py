"""What a block reads: the results JSONs it declares, by path under docs/results/, with every key
checked. A missing file or key is an `InputError` naming it (one line, exit 2); reading a file the
block did not declare is a bug in the block (the declarations are what tests perturb)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ..errors import InputError

RESULTS_DIR = Path("docs") / "results"  # under the repository root


def sha12(data: bytes) -> str:
    """The first 12 hex digits of the sha256 the source lines print."""
    return hashlib.sha256(data).hexdigest()[:12]


class Node:
    """A JSON object or array; indexing returns a Node for containers and the value itself for
    scalars, and a missing key names the file and the key's path."""

    __slots__ = ("_value", "_file", "_path")

    def __init__(self, value: Any, file: str, path: str = "") -> None:
        self._value, self._file, self._path = value, file, path

    def _child(self, key: Any, value: Any) -> Any:
        sub = f"{self._path}[{key!r}]"
        return Node(value, self._file, sub) if isinstance(value, (dict, list)) else value

    def __getitem__(self, key: Any) -> Any:
        try:
            value = self._value[key]
        except (KeyError, IndexError, TypeError):
            raise InputError(f"{self._file}: no key {self._path}[{key!r}]") from None
        return self._child(key, value)

    def get(self, key: str, default: Any = None) -> Any:
        """An optional key: `default` when it is absent (a required one uses [])."""
        return self[key] if isinstance(self._value, dict) and key in self._value else default

    def __contains__(self, key: Any) -> bool:
        return key in self._value

    def __len__(self) -> int:
        return len(self._value)

    def __iter__(self) -> Iterator[Any]:
        """An array's elements, or an object's keys."""
        if isinstance(self._value, dict):
            return iter(self._value)
        return (self._child(i, v) for i, v in enumerate(self._value))

    def items(self) -> Iterator[tuple[str, Any]]:
        return ((k, self._child(k, v)) for k, v in self._value.items())

    @property
    def raw(self) -> Any:
        return self._value


@dataclass
class Loaded:
    """Files read during one build, each parsed once: path under docs/results -> (sha12, data)."""

    results_dir: Path
    files: dict[str, tuple[str, Any]] = field(default_factory=dict)

    def load(self, rel: str, block: str) -> tuple[str, Any]:
        if rel not in self.files:
            path = self.results_dir / rel
            if not path.is_file():
                raise InputError(f"{RESULTS_DIR / rel}: not found (read by docs block '{block}')")
            data = path.read_bytes()
            try:
                parsed = json.loads(data)
            except ValueError as e:
                raise InputError(f"{RESULTS_DIR / rel}: not JSON ({e})") from None
            self.files[rel] = (sha12(data), parsed)
        return self.files[rel]


@dataclass
class Results:
    """One block's window on docs/results: only the files it declares, recorded as it reads them."""

    loaded: Loaded
    block: str
    declared: tuple[str, ...]
    read: dict[str, str] = field(default_factory=dict)  # path under docs/results -> sha12

    def json(self, rel: str) -> Node:
        if rel not in self.declared:
            raise AssertionError(f"docs block '{self.block}' reads {rel}, which it does not declare")
        digest, data = self.loaded.load(rel, self.block)
        self.read[rel] = digest
        return Node(data, str(RESULTS_DIR / rel))
