"""The code of the plug-ins a run uses, for its identity, and the check that a resume runs the same code.

A run's identity records fedblend's own code (version, git commit); a plug-in method, transform, dataset or model
(:mod:`fedblend.common.plugins`) lives outside it, so a resumed run could continue under edited plug-in code and
still claim to be one run. :func:`plugin_code` records, for each plug-in the config names, the object it
resolved to, its module's source file with that file's sha256, and the installed package and version where the
module belongs to one. :func:`check_plugin_code` compares a checkpoint's record with the code now: a plug-in
whose source changed since the run started is refused (:class:`PluginCodeChangedError`, exit 2), unless the
caller allows it (``fedblend run --resume --allow-code-change``), which warns and keeps both records.
"""

from __future__ import annotations

import inspect
import sys
import warnings
from importlib import metadata
from pathlib import Path
from typing import Any

from fedblend.common.errors import ResumeMismatchError
from fedblend.common.files import sha256_file


class PluginCodeChangedError(ResumeMismatchError):
    """``--resume`` refused because a plug-in's source file changed since the run started (exit 2)."""


def _lookup(kind: str, name: str) -> Any:
    """The object plug-in or built-in ``name`` of ``kind`` resolves to (None if there is none)."""
    if kind in ("method", "transform"):
        from fedblend.algorithms.registry import find_plugin

        return find_plugin(kind, name)
    if kind == "dataset":
        from fedblend.data.sources import find_dataset

        return find_dataset(name)
    from fedblend.models.zoo import find_model

    return find_model(name)


def _names(cfg) -> list[tuple[str, str]]:
    from fedblend.algorithms.registry import parse_method

    method, transforms = parse_method(cfg.method)
    return [("method", method), *(("transform", t) for t in transforms), ("dataset", cfg.dataset),
            ("model", cfg.model)]


def _package(module: str) -> dict[str, str]:
    """The installed distribution that provides ``module``'s top-level package, and its version ({} if none)."""
    dists = metadata.packages_distributions().get(module.split(".")[0], [])
    if not dists:
        return {}
    try:
        return {"package": dists[0], "version": metadata.version(dists[0])}
    except metadata.PackageNotFoundError:
        return {"package": dists[0]}


def plugin_code(cfg) -> dict[str, dict[str, str]]:
    """``{"<kind> <name>": {"object", "file", "sha256"[, "package", "version"]}}`` for each plug-in ``cfg`` uses
    (built-in names, whose code is fedblend's, are left out)."""
    out: dict[str, dict[str, str]] = {}
    for kind, name in _names(cfg):
        obj = _lookup(kind, name)
        module = getattr(obj, "__module__", None) or ""
        if obj is None or module == "fedblend" or module.startswith("fedblend."):
            continue
        rec = {"object": f"{module}:{getattr(obj, '__qualname__', name)}"}
        try:
            path = inspect.getsourcefile(sys.modules[module]) or ""
        except (KeyError, TypeError):
            path = ""
        if path and Path(path).is_file():
            rec.update(file=str(Path(path).resolve()), sha256=sha256_file(path))
        out[f"{kind} {name}"] = {**rec, **_package(module)}
    return out


def check_plugin_code(identity: dict, started: dict, ck_path: Path, allow_change: bool = False) -> None:
    """On ``--resume``: refuse when a plug-in's source differs from the one the run started with (see the module
    docstring); with ``allow_change``, warn instead and record the start's code under ``plugins_at_start``."""
    now, was = identity.get("plugins", {}), started.get("plugins")
    if was is None:  # a checkpoint of an older fedblend recorded no plug-in code
        if now:
            warnings.warn(f"{ck_path} records no plug-in code (written by an older fedblend): resuming without "
                          f"checking that {', '.join(now)} is the code the run started with", RuntimeWarning,
                          stacklevel=3)
        return
    changed = [key for key, rec in was.items() if now.get(key, {}).get("sha256") != rec.get("sha256")]
    if not changed:
        return
    key = changed[0]
    old, new = was[key], now.get(key, {})
    obj = "" if key.endswith(f" {old.get('object')}") else f"{old.get('object')}, "
    what = (f"plug-in {key} ({obj}{old.get('file') or 'no source file'}): its code changed since "
            f"the run started (sha256 {str(old.get('sha256'))[:12]}... then, "
            f"{str(new.get('sha256'))[:12] + '...' if new.get('sha256') else 'missing'} now)")
    if not allow_change:
        more = f" ({len(changed) - 1} more plug-in(s) changed)" if len(changed) > 1 else ""
        raise PluginCodeChangedError(f"--resume: {what}{more}, so the later rounds would not be the run's: restore "
                                     f"the code, add --allow-code-change to continue anyway (recorded in the "
                                     f"summary), or start over with --force")
    warnings.warn(f"--allow-code-change: {what}; the run continues with the new code and records the old one "
                  f"under run.plugins_at_start", RuntimeWarning, stacklevel=3)
    identity["plugins_at_start"] = started.get("plugins_at_start", was)
