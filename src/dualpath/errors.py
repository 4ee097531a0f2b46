"""User-facing errors. The CLI prints `InputError` messages and exits with code 2 (no traceback)."""

import sys
from typing import Any, Callable


class InputError(ValueError):
    """Bad user input: an unknown name, a malformed value or file line, an impossible setting.

    The message must name the offending input (option, field, file and line number).
    """


def run_cli(app: Callable[[], Any], console: Any) -> None:
    """Run a CLI app: usage errors exit 2 through typer; an `InputError` from anywhere below is
    printed as one line on `console` (a rich Console) and exits 2; anything else is a bug and
    keeps its traceback."""
    try:
        app()
    except InputError as e:
        console.print(f"[red]error:[/red] {e}", highlight=False)
        sys.exit(2)
