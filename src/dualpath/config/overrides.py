"""Changing a frozen config tree by path, `section.field`: `--set section.field=value` from text
(each value takes its field's type), `set_fields` from values; the result is validated on
construction (the sections' dataclasses). Config trees to and from JSON."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, TypeVar

from ..errors import InputError

T = TypeVar("T")


def _coerce(text: str, current: Any, declared: str, path: str) -> Any:
    """`text` as the field's value: the type of its current value, or, unset (None), its declared
    type's first part ("float | None": a float; str or an enum: the text, which the section checks)."""
    if hasattr(current, "__dataclass_fields__"):
        raise InputError(f"--set {path}: is a section, name one of its fields")
    low = text.strip().lower()
    if low in ("none", "null"):
        return None
    if current is None:
        kind = declared.split("|")[0].strip()
        current = 0 if kind == "int" else 0.0 if kind == "float" else ""
    if isinstance(current, bool):
        if low in ("true", "1", "yes", "on"):
            return True
        if low in ("false", "0", "no", "off"):
            return False
        raise InputError(f"--set {path}: expected true or false, got {text!r}")
    try:
        if isinstance(current, int):
            return int(float(text)) if float(text).is_integer() else int(text)
        if isinstance(current, float):
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
        cfg = _replace_path(cfg, parts, lambda current, declared, t=text, p=path: _coerce(t, current, declared, p), path)
    return cfg


def set_fields(cfg: T, changes: Mapping[str, Any]) -> T:
    """`cfg` with each `section.field` (or top-level `field`) of `changes` set to its value, e.g.
    {"faults.policy": "fail", "links.cnic_bytes_per_s": 2e5}; an unknown path is an InputError."""
    for path, value in changes.items():
        cfg = _replace_path(cfg, path.split("."), lambda current, declared, v=value: v, path)
    return cfg


def _replace_path(obj: Any, parts: list[str], value_for: Callable[[Any, str], Any], path: str) -> Any:
    name = parts[0]
    if not dataclass_has_field(obj, name):
        raise InputError(f"--set {path}: {type(obj).__name__} has no field {name!r}")
    current = getattr(obj, name)
    if len(parts) == 1:  # a field, or a whole section (set_fields only)
        value = value_for(current, str(obj.__dataclass_fields__[name].type))
    else:
        value = _replace_path(current, parts[1:], value_for, path)
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
