"""The CLI's two consoles: status lines on stderr, tables and results on stdout."""

import sys

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)  # status lines ("wrote PATH") never hard-wrap a path
out = Console(width=None if sys.stdout.isatty() else 160)


def say_build() -> None:
    """The simulator's build, one status line once a command that simulates has checked its input."""
    from .._build import build_line

    console.print(build_line(), markup=False, highlight=False)
