"""The generated blocks of one markdown file: a line `<!-- generated: NAME -->`, the block's lines,
then a line `<!-- end generated -->`. A marker may be indented (a block inside a list item): the
block's lines then carry the start marker's indent. Blocks do not nest; a start without an end, an
end without a start, a start inside a block or a line that opens like a marker but is not one is an
error naming the file and line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import InputError

START_RE = re.compile(r"^(\s*)<!-- generated: ([A-Za-z0-9_.-]+) -->\s*$")
END_RE = re.compile(r"^\s*<!-- end generated -->\s*$")
OPENS_LIKE_A_MARKER = ("<!-- generated", "<!-- end generated")


@dataclass(frozen=True, slots=True)
class Slot:
    name: str
    start: int  # index of the start marker's line; the body is lines[start + 1 : end] (half-open)
    end: int  # index of the end marker's line
    indent: str  # the start marker's leading whitespace, which every non-blank body line carries


def find_slots(label: str, lines: list[str]) -> list[Slot]:
    """The blocks of a file's lines (without line ends), in order; `label` names the file in errors."""
    slots: list[Slot] = []
    open_at: int | None = None
    name = indent = ""
    for i, line in enumerate(lines):
        if "<!--" not in line:
            continue
        start, end = START_RE.match(line), END_RE.match(line)
        if not (start or end) and line.lstrip().startswith(OPENS_LIKE_A_MARKER):
            raise InputError(f"{label}:{i + 1}: malformed marker {line.strip()!r} (expected "
                             "'<!-- generated: NAME -->' or '<!-- end generated -->' alone on its line)")
        if start and open_at is not None:
            raise InputError(f"{label}:{i + 1}: generated block '{start.group(2)}' starts inside block "
                             f"'{name}' (line {open_at + 1}), which has no end marker before it")
        if start:
            open_at, indent, name = i, start.group(1), start.group(2)
        elif end and open_at is None:
            raise InputError(f"{label}:{i + 1}: '<!-- end generated -->' without a start marker")
        elif end:
            slots.append(Slot(name, open_at, i, indent))
            open_at = None
    if open_at is not None:
        raise InputError(f"{label}:{open_at + 1}: generated block '{name}' has no '<!-- end generated -->'")
    return slots


def fill(lines: list[str], slots: list[Slot], bodies: list[list[str]]) -> list[str]:
    """`lines` with each slot's body replaced by the matching entry of `bodies`."""
    out: list[str] = []
    at = 0
    for slot, body in zip(slots, bodies, strict=True):
        out += lines[at:slot.start + 1] + body
        at = slot.end
    return out + lines[at:]
