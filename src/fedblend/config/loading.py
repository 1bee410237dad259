"""A run config from a TOML file and ``--set key=value`` overrides (values parsed as TOML), validated; and the
resolved config written back as TOML (``config.toml`` of a results directory)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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
    """Minimal TOML writer for resolved configs (scalars first, then one level of tables)."""

    def fmt(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, (int, float)):
            return repr(v)
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(fmt(x) for x in v) + "]"
        if isinstance(v, dict):  # an inline table (partition.flwr_options)
            return "{" + ", ".join(f"{kk} = {fmt(vv)}" for kk, vv in v.items()) + "}"
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = [f"{k} = {fmt(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None]
    for k, v in data.items():
        if isinstance(v, dict):
            lines.append(f"\n[{k}]")
            lines += [f"{kk} = {fmt(vv)}" for kk, vv in v.items() if vv is not None]
    return "\n".join(lines) + "\n"
