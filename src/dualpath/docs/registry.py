"""The registry of generated blocks: {name: Block}. A subject module (blocks/*.py) registers each
of its blocks with `@block(name, reads=..., command=...)`; importing the `blocks` package fills it
(`blocks.REGISTRY` is this dict, complete)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .results import Results

Render = Callable[[Results], str]


@dataclass(frozen=True, slots=True)
class Block:
    name: str
    render: Render  # results -> markdown, without the source line (build.py adds it)
    reads: tuple[str, ...]  # JSON paths under docs/results/ the block reads, all of them
    commands: tuple[str, ...]  # what regenerates those JSONs (printed in the source line)


REGISTRY: dict[str, Block] = {}


def block(name: str, reads: tuple[str, ...], command: str | tuple[str, ...]) -> Callable[[Render], Render]:
    """Register `fn` as block `name`, reading exactly `reads`."""
    commands = (command,) if isinstance(command, str) else command

    def register(fn: Render) -> Render:
        if name in REGISTRY:
            raise ValueError(f"docs block {name!r} registered twice")
        REGISTRY[name] = Block(name, fn, reads, commands)
        return fn

    return register
