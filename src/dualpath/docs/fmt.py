"""Formatting shared by the blocks: numbers as the docs print them, and markdown tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """A markdown table; cells are str()-ed, `|` in a cell escaped."""
    def line(cells: Sequence[object]) -> str:
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(r) for r in rows)])


def num(x: float, digits: int = 0) -> str:
    """Thousands separated, fixed decimals: num(3986.0, 1) -> '3,986.0'."""
    return f"{x:,.{digits}f}"


def sig(x: float, digits: int = 3) -> str:
    """`digits` significant digits, never in exponent form for the docs' magnitudes:
    sig(0.96047) -> '0.960', sig(3599.6) -> '3,600'."""
    if x == 0:
        return "0"
    magnitude = len(str(int(abs(x)))) if abs(x) >= 1 else 0
    if abs(x) < 1:
        lead = f"{abs(x):.12f}".split(".")[1]
        zeros = len(lead) - len(lead.lstrip("0"))
        return f"{x:.{zeros + digits}f}"
    return num(x, max(digits - magnitude, 0))


def pct(x: float, digits: int = 1, signed: bool = True) -> str:
    """A fraction as a percentage: pct(-0.054) -> '-5.4%'."""
    return f"{100 * x:+.{digits}f}%" if signed else f"{100 * x:.{digits}f}%"


def ratio(x: float, digits: int = 2) -> str:
    return f"{x:.{digits}f}"


def mb(num_bytes: float, digits: int = 1) -> str:
    """Bytes as MB (1e6)."""
    return num(num_bytes / 1e6, digits)


def ms(seconds: float, digits: int = 1) -> str:
    return num(seconds * 1e3, digits)


def span(values: Iterable[float], fmt=ratio) -> str:
    """'lo-hi' of formatted values, or one value when they format alike."""
    vals = sorted(values)
    lo, hi = fmt(vals[0]), fmt(vals[-1])
    return lo if lo == hi else f"{lo}-{hi}"


def met(flag: bool) -> str:
    return "met" if flag else "**missed**"
