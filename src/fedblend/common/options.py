"""Typed option tables: build a dataclass from a dict, with errors that name the field and what is allowed.

Used for the run config's tables and for every method's / transform's options, so a typo such as
``[train] lrr = 0.1`` fails up front with ``unknown field 'train.lrr'; allowed: batch_size, epochs, ...``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Union


class ConfigError(ValueError):
    """An invalid config value; the message names the field and the allowed values."""


def _check(value: Any, tp: Any, where: str, choices: tuple | None) -> Any:
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check(value, a, where, choices)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{where}: invalid value {value!r}")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where} must be a list, got {value!r}")
        inner = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        vals = [_check(v, inner, f"{where}[{i}]", None) for i, v in enumerate(value)]
        return tuple(vals) if origin is tuple else vals
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where} must be true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where} must be an integer, got {value!r}")
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where} must be a number, got {value!r}")
        value = float(value)
    elif tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where} must be a string, got {value!r}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where} must be one of {list(choices)}, got {value!r}")
    return value


def from_table(cls: type, table: dict[str, Any] | None, where: str) -> Any:
    """Instantiate dataclass ``cls`` from ``table``; field choices come from ``cls.CHOICES`` if defined."""
    table = dict(table or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "(none)"
        raise ConfigError(f"unknown field {where + '.' if where else ''}{unknown[0]}; allowed: {allowed}")
    hints = typing.get_type_hints(cls)
    choices = getattr(cls, "CHOICES", {})
    values = {k: _check(v, hints[k], f"{where}.{k}" if where else k, choices.get(k)) for k, v in table.items()}
    try:
        obj = cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(where)
    return obj


def to_table(obj: Any) -> dict[str, Any]:
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else dict(obj)
