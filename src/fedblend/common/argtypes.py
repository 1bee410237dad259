"""Argument types checked at the public API's boundary (``fedblend.run``, ``load_config``, ``run_experiment``).

A wrong *kind* of argument is a caller's mistake that Python would otherwise report far from its cause, or not at
all: ``Path(123)`` fails deep inside, ``load_config(path, "rounds=3")`` iterates the string's characters as nine
overrides, ``resume="no"`` is truthy and resumes. Each check raises a ``TypeError`` naming the argument, what it
accepts and what it got, before anything is read or written. Wrong *values* of the right kind stay the config
layer's (:class:`~fedblend.common.errors.ConfigError`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _got(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def path_arg(value: Any, name: str, optional: bool = True) -> Path | None:
    """``value`` as a Path: a ``str`` or an ``os.PathLike`` (None where ``optional``); bytes, numbers, lists
    and the rest are refused."""
    if value is None and optional:
        return None
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        path = os.fspath(value)
        if isinstance(path, str):
            return Path(path)
    accepts = "a path (str or os.PathLike)" + (" or None" if optional else "")
    raise TypeError(f"{name} must be {accepts}, got {_got(value)}")


def bool_arg(value: Any, name: str) -> bool:
    """``value`` if it is a ``bool`` (``"no"``, ``0`` or ``None`` would pass a truth test with another meaning)."""
    if isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be True or False, got {_got(value)}")


def int_arg(value: Any, name: str, optional: bool = True) -> int | None:
    """``value`` if it is an ``int`` (not a bool; None where ``optional``)."""
    if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool)):
        return value
    raise TypeError(f"{name} must be an int{' or None' if optional else ''}, got {_got(value)}")


def overrides_arg(value: Any, name: str = "overrides", mapping: bool = False) -> list[str] | Mapping[str, Any]:
    """``value`` as a list of ``"key=value"`` strings (a list or tuple of str; None: none), or, where ``mapping``,
    a dict of dotted keys as it is. A lone string is refused: it would be iterated character by character."""
    if value is None:
        return []
    if mapping and isinstance(value, Mapping):
        return value
    accepts = "a list of 'key=value' strings" + (" or a dict" if mapping else "")
    if isinstance(value, str):
        raise TypeError(f"{name} must be {accepts}, got the string {value!r} (for one override: [{value!r}])")
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{name} must be {accepts}, got {_got(value)}")
    bad = [v for v in value if not isinstance(v, str)]
    if bad:
        raise TypeError(f"{name} must be {accepts}, but it holds {_got(bad[0])}")
    return list(value)
