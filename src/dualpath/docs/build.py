"""Render every generated block of README.md and docs/**/*.md; write them (`build`) or name the
first line that differs from the committed text (`check`). Text outside the markers is copied
byte for byte."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from .markers import Slot, fill, find_slots
from .blocks import REGISTRY
from .registry import Block
from .results import RESULTS_DIR, Loaded, Results


@dataclass(frozen=True, slots=True)
class Rendered:
    """One markdown file with generated blocks: its committed text and what build writes."""

    rel: str  # path under the root
    slots: tuple[Slot, ...]
    committed: tuple[str, ...]  # the file's lines
    bodies: tuple[tuple[str, ...], ...]  # per slot, the lines build writes between its markers

    def text(self) -> str:
        return "\n".join(fill(list(self.committed), list(self.slots), [list(b) for b in self.bodies]))


@dataclass(frozen=True, slots=True)
class Outcome:
    files: tuple[Rendered, ...]
    num_blocks: int
    num_jsons: int  # distinct JSONs the blocks read


@dataclass(frozen=True, slots=True)
class Difference:
    file: str
    line: int  # 1-based, in the committed file
    block: str
    committed: str
    built: str


def markdown_files(root: Path) -> list[Path]:
    """README.md and every docs/**/*.md, in a fixed order."""
    readme = root / "README.md"
    return ([readme] if readme.is_file() else []) + sorted((root / "docs").rglob("*.md"))


def source_line(block: Block, read: dict[str, str]) -> str:
    """The block's last line: each JSON with its sha256 prefix, and the command that makes it."""
    files = ", ".join(f"`{RESULTS_DIR / rel}` sha256:{digest}" for rel, digest in read.items())
    commands = "; ".join(f"`{c}`" for c in block.commands)
    return f"<sub>source: {files}; command: {commands}</sub>"


def render_block(block: Block, loaded: Loaded) -> tuple[str, ...]:
    results = Results(loaded, block.name, block.reads)
    markdown = block.render(results).strip("\n")
    unread = [rel for rel in block.reads if rel not in results.read]
    if unread:
        raise AssertionError(f"docs block '{block.name}' declares {unread} but did not read them")
    return ("", *markdown.split("\n"), "", source_line(block, results.read), "")


def render(root: Path) -> Outcome:
    blocks, loaded = REGISTRY, Loaded(root / RESULTS_DIR)
    files: list[Rendered] = []
    for path in markdown_files(root):
        rel = str(path.relative_to(root))
        lines = path.read_bytes().decode("utf-8").split("\n")
        slots = find_slots(rel, lines)
        if not slots:
            continue
        bodies = []
        for slot in slots:
            if slot.name not in blocks:
                raise InputError(f"{rel}:{slot.start + 1}: unknown generated block '{slot.name}' "
                                 f"(known: {', '.join(sorted(blocks))})")
            bodies.append(tuple(slot.indent + line if line else "" for line in render_block(blocks[slot.name], loaded)))
        files.append(Rendered(rel, tuple(slots), tuple(lines), tuple(bodies)))
    return Outcome(tuple(files), sum(len(f.slots) for f in files), len(loaded.files))


def first_difference(outcome: Outcome) -> Difference | None:
    for f in outcome.files:
        for slot, body in zip(f.slots, f.bodies):
            old = f.committed[slot.start + 1:slot.end]
            for i in range(max(len(old), len(body))):
                was = old[i] if i < len(old) else "(the block ends here)"
                now = body[i] if i < len(body) else "(the block ends here)"
                if was != now:
                    return Difference(f.rel, slot.start + 2 + i, slot.name, was, now)
    return None


def build(root: Path) -> tuple[Outcome, list[str]]:
    """Write every file whose blocks changed; returns the outcome and the files written."""
    outcome, written = render(root), []
    for f in outcome.files:
        text = f.text()
        if text != "\n".join(f.committed):
            (root / f.rel).write_bytes(text.encode("utf-8"))
            written.append(f.rel)
    return outcome, written
