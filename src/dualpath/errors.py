"""User-facing errors. The CLI prints `InputError` messages and exits with code 2 (no traceback)."""


class InputError(ValueError):
    """Bad user input: an unknown name, a malformed value or file line, an impossible setting.

    The message must name the offending input (option, field, file and line number).
    """
