"""Plug-ins: methods, transforms, datasets and models from other packages, found by name.

A name that is not built in is looked up, in order, as

1. ``"package.module:Attribute"`` -- imported directly (``method = "mypkg.methods:FedAvgM"`` in a config); the
   config records the path, so every process that reads the config (``sweep``'s runs, worker processes, Flower
   nodes) imports the same object the same way;
2. an entry point of the kind's group, declared by an installed package (its ``pyproject.toml``)::

       [project.entry-points."fedblend.methods"]
       fedavgm = "mypkg.methods:FedAvgM"

   groups: ``fedblend.methods`` (a :class:`~fedblend.core.method.Method` subclass), ``fedblend.transforms`` (a
   :class:`~fedblend.core.method.ClientTransform` subclass), ``fedblend.datasets`` (a callable ``(data_dir,
   download) -> RawDataset``), ``fedblend.models`` (a callable ``(info) -> FedModel``);
3. a method or transform that a *package entry point* of its group defines: an entry point that names a module
   or package and no attribute (``mypkg = "mypkg"``) declares every method (transform) the package defines,
   each under its class's ``name``: :func:`import_package` imports the package and all its modules, and
   ``algorithms.registry`` admits the classes defined there that are decorated with ``@register_method``
   (``@register_transform``). fedblend declares its own built-ins this way (``fedblend = "fedblend.algorithms"``).

This module only finds and imports; each registry (``algorithms.registry``, ``data.sources``, ``models.zoo``)
checks what it got and registers it under the name it was asked for, so a plug-in is loaded only when a config
names it (``fedblend methods`` lists them all). Every failure is a :class:`PluginError` with one line naming the
plug-in, where it was declared and what went wrong.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from fedblend.common.errors import ConfigError

GROUPS = {"method": "fedblend.methods", "transform": "fedblend.transforms", "dataset": "fedblend.datasets",
          "model": "fedblend.models"}
_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: the groups whose entry points may name a whole package (every class of it decorated as a method / transform)
PACKAGE_KINDS = ("method", "transform")


class PluginError(ConfigError):
    """A plug-in that cannot be imported, or is not what its group needs."""


def is_path(name: str) -> bool:
    """Whether ``name`` is a ``"package.module:Attribute"`` reference."""
    return bool(_PATH.match(name))


def declared(kind: str) -> dict[str, EntryPoint]:
    """The entry points of ``kind``'s group that name one object (``"module:Attribute"``), by name (nothing is
    imported); a package entry point of a method or transform group is in :func:`declared_packages` instead."""
    return {ep.name: ep for ep in entry_points(group=GROUPS[kind]) if ep.attr or kind not in PACKAGE_KINDS}


def declared_packages(kind: str) -> dict[str, EntryPoint]:
    """The package entry points of ``kind``'s group (a method or transform group), by name: those that name a
    module or package and no attribute (nothing is imported)."""
    if kind not in PACKAGE_KINDS:
        return {}
    return {ep.name: ep for ep in entry_points(group=GROUPS[kind]) if not ep.attr}


def describe(kind: str, ep: EntryPoint) -> str:
    """How an error names entry point ``ep`` of ``kind``'s group: its declaration and its package."""
    dist = getattr(ep, "dist", None)
    return f"entry point {ep.name} = {ep.value!r} of group {GROUPS[kind]!r}" + (
        f" (package {dist.name} {dist.version})" if dist is not None else "")


def find(kind: str, name: str) -> Any | None:
    """The object plug-in ``name`` of ``kind`` refers to (imported), or None when no plug-in has that name."""
    if is_path(name):
        return _import(kind, name, repr(name))
    ep = declared(kind).get(name)
    return None if ep is None else _import(kind, ep.value, describe(kind, ep))


def import_package(kind: str, module: str, where: str) -> list[str]:
    """Import ``module`` and, if it is a package, every module under it (subpackages included, in name order);
    returns their names. ``where`` names the declaration in the one-line :class:`PluginError` of a module that
    cannot be imported."""
    mod = _module(kind, module, where)
    names = [module]
    for info in pkgutil.iter_modules(getattr(mod, "__path__", None) or [], f"{module}."):
        if info.ispkg:
            names += import_package(kind, info.name, where)
        else:
            _module(kind, info.name, where)
            names.append(info.name)
    return names


def _module(kind: str, module: str, where: str) -> Any:
    try:
        return importlib.import_module(module)
    except PluginError:  # a class the module registers failed the registry's checks: that error, as it is
        raise
    except Exception as exc:  # noqa: BLE001 - any import failure of user code is reported the same way
        raise PluginError(f"{kind} plug-in {where}: cannot import module {module!r}: {type(exc).__name__}: "
                          f"{_first_line(exc)}") from exc


def _import(kind: str, path: str, where: str) -> Any:
    module, _, attr = path.partition(":")
    obj: Any = _module(kind, module, where)
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginError(f"{kind} plug-in {where}: module {module!r} has no attribute {attr!r}") from exc
    return obj


def check_subclass(kind: str, name: str, obj: Any, base: type) -> type:
    """``obj`` if it is a subclass of ``base``, else a one-line :class:`PluginError`."""
    if not (isinstance(obj, type) and issubclass(obj, base)):
        what = f"the class {obj.__module__}.{obj.__qualname__}" if isinstance(obj, type) else \
            f"a {type(obj).__name__}"
        raise PluginError(f"{kind} plug-in {name!r} is {what}, not a subclass of fedblend's {base.__name__} "
                          f"({base.__module__}.{base.__name__})")
    return obj


def check_callable(kind: str, name: str, obj: Any, what: str) -> Any:
    """``obj`` if it is callable, else a one-line :class:`PluginError` (``what`` it should be)."""
    if not callable(obj):
        raise PluginError(f"{kind} plug-in {name!r} is a {type(obj).__name__}, not {what}")
    return obj


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else ""
