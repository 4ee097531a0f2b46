"""The CLI's two consoles: status lines on stderr, tables and results on stdout."""

import sys

from rich.console import Console

console = Console(stderr=True, soft_wrap=True)  # status lines ("wrote PATH") never hard-wrap a path
out = Console(width=None if sys.stdout.isatty() else 160)
