"""A run config from a TOML file and ``--set key=value`` overrides (values parsed as TOML), validated; and the
resolved config written back as TOML (``config.toml`` of a results directory)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import tomli_w

from fedblend.common.argtypes import overrides_arg, path_arg
from fedblend.common.options import ConfigError
from fedblend.config.schema import RunConfig
from fedblend.config.validation import config_from_dict

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def parse_value(text: str) -> Any:
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in raw.items()}
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        node = raw
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}: {p} is not a table")
        node[parts[-1]] = parse_value(text.strip())
    return raw


def load_config(path: str | Path | None, overrides: list[str] | None = None) -> RunConfig:
    """The validated :class:`RunConfig` of the TOML file ``path`` (None: the defaults) with ``overrides``, a list
    of ``--set``-style ``"key=value"`` strings, applied. A wrong kind of argument (a number or bytes for the
    path, one string for the overrides) is a ``TypeError`` naming it (:mod:`fedblend.common.argtypes`)."""
    path = path_arg(path, "load_config's path")
    overrides = overrides_arg(overrides, "load_config's overrides")
    raw: dict[str, Any] = {}
    if path is not None:
        p = path
        if not p.exists():
            raise ConfigError(f"config file {p} does not exist")
        if not p.is_file():
            raise ConfigError(f"config file {p} is not a file")
        try:
            raw = tomllib.loads(p.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: invalid TOML ({exc})") from exc
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"config file {p} cannot be read as UTF-8 text ({exc})") from exc
    return config_from_dict(apply_overrides(raw, overrides or []))


def dump_toml(data: dict[str, Any]) -> str:
    """A resolved config as TOML text, written by ``tomli_w`` (the one TOML writer: runs' ``config.toml``, the
    Flower app's ``pyproject.toml``, bookkeeping configs); unset (``None``) fields are left out, as TOML has no
    null. Reads back with :func:`load_config` to the same values."""
    return tomli_w.dumps(_without_none(data))


def toml_value(value: Any) -> str:
    """One value as the TOML text :func:`parse_value` (and ``--set key=TEXT``) reads back to it (``tomli_w``:
    ``inf`` / ``nan`` and strings escaped the TOML way)."""
    return tomli_w.dumps({"v": value})[len("v = "):].rstrip("\n")


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_without_none(v) for v in value]
    return value
