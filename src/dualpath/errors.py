"""User-facing errors. The CLI prints `InputError` messages and exits with code 2 (no traceback)."""

import re
import sys
from typing import Any, Callable, TextIO

import typer

# A typer that vendors click raises its usage errors as `TyperException`s; an older one
# raises click's own.
if hasattr(typer, "TyperException"):
    _UsageErrors: tuple[type[Any], ...] = (typer.TyperException,)  # click's API: format_message, exit_code, ctx
else:  # pragma: no cover - depends on the installed typer
    import click

    _UsageErrors = (click.ClickException,)


class InputError(ValueError):
    """Bad user input: an unknown name, a malformed value or file line, an impossible setting.

    The message must name the offending input (option, field, file and line number).
    """


def error_line(message: str) -> str:
    """`error: <message>` as exactly one line: embedded line breaks become spaces, so a script
    (or a test) can grep for the whole message whatever the terminal width."""
    return "error: " + re.sub(r"\s*[\r\n]+\s*", " ", message.strip())


def print_error(message: str, stream: TextIO | None = None) -> None:
    """Write `error_line(message)` unwrapped: plain text, no markup, no hard wrap at the
    console width (rich would wrap a long path at COLUMNS even on a pipe)."""
    stream = sys.stderr if stream is None else stream
    stream.write(error_line(message) + "\n")
    stream.flush()


def run_cli(app: Callable[..., Any]) -> None:
    """Run a typer app: a usage error (unknown option, bad value) or an `InputError` from
    anywhere below prints one `error:` line on stderr and exits 2; `--help`, and a group
    called without a command, print help as typer does; anything else is a bug and keeps its
    traceback."""
    try:
        code = app(standalone_mode=False)
    except InputError as e:
        print_error(str(e))
        sys.exit(2)
    except _UsageErrors as e:
        if type(e).__name__ == "NoArgsIsHelpError":  # a group called without a command (click >= 8.2)
            # typer's rich formatter has printed the help while building the exception; the
            # plain one leaves it in the message
            if e.format_message().strip():
                e.show()
            sys.exit(e.exit_code)
        ctx = getattr(e, "ctx", None)
        hint = f" (try '{ctx.command_path} {ctx.help_option_names[0]}')" if ctx is not None and ctx.help_option_names else ""
        print_error(e.format_message() + hint)
        sys.exit(e.exit_code)
    except typer.Abort:
        print_error("aborted")
        sys.exit(1)
    # without standalone mode, click returns the code of a `typer.Exit` (130 for Ctrl-C)
    if isinstance(code, int) and code:
        sys.exit(code)
