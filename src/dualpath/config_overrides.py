"""`--set section.field=value` on a frozen config tree: each value takes its field's type and the
result is validated on construction (config.py's dataclasses)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, TypeVar

from .errors import InputError

T = TypeVar("T")


def _coerce(text: str, current: Any, path: str) -> Any:
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if isinstance(current, bool):
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise InputError(f"--set {path}: expected true or false, got {text!r}")
    try:
        if isinstance(current, int):
            return int(float(text)) if float(text).is_integer() else int(text)
        if isinstance(current, float) or current is None:
            return float(text)
    except ValueError:
        raise InputError(f"--set {path}: expected a number, got {text!r}") from None
    return text


def apply_overrides(cfg: T, assignments: list[str]) -> T:
    """`--set section.field=value` (nested with dots, e.g. cluster.node.storage_read_bytes_per_s=none).
    Values take the type of the field's current value; the result is validated on construction."""
    for item in assignments:
        if "=" not in item:
            raise InputError(f"--set expects path=value, got {item!r}")
        path, text = item.split("=", 1)
        parts = path.strip().split(".")
        cfg = _replace_path(cfg, parts, text, path)
    return cfg


def _replace_path(obj: Any, parts: list[str], text: str, path: str) -> Any:
    name = parts[0]
    if not dataclass_has_field(obj, name):
        raise InputError(f"--set {path}: {type(obj).__name__} has no field {name!r}")
    current = getattr(obj, name)
    if len(parts) == 1:
        if hasattr(current, "__dataclass_fields__"):
            raise InputError(f"--set {path}: is a section, name one of its fields")
        value = _coerce(text, current, path)
    else:
        value = _replace_path(current, parts[1:], text, path)
    return replace(obj, **{name: value})


def dataclass_has_field(obj: Any, name: str) -> bool:
    return hasattr(obj, "__dataclass_fields__") and name in obj.__dataclass_fields__


def config_to_json(cfg: Any) -> str:
    """A config tree as JSON (what a joining engine is sent: runtime/engine/join.py)."""
    import json
    from dataclasses import asdict

    return json.dumps(asdict(cfg), sort_keys=True)


def config_from_json(cls: type[T], text: str) -> T:
    """The inverse of `config_to_json` for `cls`: nested sections come back as their dataclasses,
    fields this version does not know are an InputError, and the result validates on construction."""
    import json

    try:
        data = json.loads(text)
    except ValueError as exc:
        raise InputError(f"not a JSON config: {exc}") from None
    return _from_dict(cls, data, cls.__name__)


def _from_dict(cls: Any, data: Any, path: str) -> Any:
    import typing
    from dataclasses import fields, is_dataclass

    if not isinstance(data, dict):
        raise InputError(f"{path}: expected an object")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = set(data) - known
    if unknown:
        raise InputError(f"{path}: unknown field(s) {sorted(unknown)}")
    kwargs = {}
    for name, value in data.items():
        hint = hints.get(name)
        kwargs[name] = _from_dict(hint, value, f"{path}.{name}") if is_dataclass(hint) else value
    return cls(**kwargs)
