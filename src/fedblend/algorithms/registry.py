"""Registry of methods and client transforms; ``"fedavg+ala"`` composes a method with transforms.

Built-ins and plug-ins are found the same way: as entry points of the groups ``fedblend.methods`` and
``fedblend.transforms`` (:mod:`fedblend.common.plugins`). fedblend declares its own with one *package entry
point* per group in its ``pyproject.toml``, ``fedblend = "fedblend.algorithms"``: the methods (transforms) of a
package are the classes defined in its modules that are decorated with :func:`register_method`
(:func:`register_transform`), found by :func:`admit_package` after importing every module of the package.
:func:`load_builtins` (run when :mod:`fedblend.algorithms` is imported) loads them through the checks a plug-in
meets (:func:`admit`), so ``METHODS`` holds every built-in from the start and a plug-in only when a config names
it. In a source tree the declarations are read from its ``pyproject.toml``, in an installed package from its
metadata (:func:`builtin_entry_points`).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from fedblend.common import plugins
from fedblend.common.guard import guarded, returned_wrong
from fedblend.common.options import from_table
from fedblend.core.method import ClientTransform, Method

METHODS: dict[str, type[Method]] = {}
TRANSFORMS: dict[str, type[ClientTransform]] = {}
#: the classes decorated with :func:`register_method` / :func:`register_transform`, by kind (:func:`defined`)
DECORATED: dict[str, list[type]] = {"method": [], "transform": []}
_LOADED: set[tuple[str, str]] = set()  # the package entry points loaded so far, (kind, module)


def register_method(cls: type[Method]) -> type[Method]:
    """Class decorator: register ``cls`` under its ``name`` through :func:`admit`, as a method its module defines."""
    return _register("method", cls)


def register_transform(cls: type[ClientTransform]) -> type[ClientTransform]:
    """Class decorator: :func:`register_method` for a client transform."""
    return _register("transform", cls)


def _register(kind: str, cls: type) -> type:
    admit(kind, getattr(cls, "name", None), cls)
    if cls not in DECORATED[kind]:
        DECORATED[kind].append(cls)
    return cls


def defined(kind: str, package: str) -> list[type]:
    """The methods (``kind`` ``"method"``) or transforms that (imported) package ``package`` defines: the decorated
    classes whose module is ``package`` or one under it (a class imported from elsewhere is not one)."""
    return [c for c in DECORATED[kind] if c.__module__ == package or c.__module__.startswith(f"{package}.")]


def make_options(cls: type, values: Mapping[str, Any] | None, where: str) -> Any:
    """Build an options dataclass from a table, with errors naming the bad field and the allowed ones."""
    return from_table(cls, dict(values or {}), where)


def find_plugin(kind: str, name: str) -> type | None:
    """Method or transform ``name`` from a plug-in (``fedblend.common.plugins``: a ``"pkg.module:Class"`` path or
    an entry point of ``fedblend.methods`` / ``fedblend.transforms``), registered under ``name``; None if there
    is none. Built-in names win (they are in the registry already)."""
    table = METHODS if kind == "method" else TRANSFORMS
    if name in table:
        return table[name]
    obj = plugins.find(kind, name)
    if obj is not None:
        return admit(kind, name, obj)
    failed = load_packages(kind)  # the packages that declare every class they define (plugins.declared_packages)
    if name not in table and failed:  # it may be in a package that fails to load: that package's error
        raise plugins.PluginError(next(iter(failed.values())))
    return table.get(name)


def admit_package(kind: str, module: str, where: str) -> list[str]:
    """Import package (or module) ``module`` whole and :func:`admit` each method (``kind``) it :func:`defined`
    under its class's ``name``; returns those names. ``where`` names the entry point in a one-line
    :class:`~fedblend.common.plugins.PluginError`: a module that cannot be imported, or a package that defines
    no ``kind``."""
    plugins.import_package(kind, module, where)
    classes = defined(kind, module)
    if not classes:
        raise plugins.PluginError(f"{kind} plug-in {where}: {module!r} defines no {kind} (a class decorated with "
                                  f"@fedblend.algorithms.registry.register_{kind} in one of its modules)")
    _LOADED.add((kind, module))
    return [admit(kind, getattr(c, "name", None), c).name for c in classes]


def load_packages(kind: str) -> dict[str, str]:
    """Load the package entry points of ``kind``'s group not loaded yet; ``{entry point: error}`` of those that fail."""
    failed = {}
    for name, ep in sorted(plugins.declared_packages(kind).items()):
        if (kind, ep.value) not in _LOADED:
            try:
                admit_package(kind, ep.value, plugins.describe(kind, ep))
            except plugins.PluginError as exc:
                failed[name] = str(exc)
    return failed


def admit(kind: str, name: str, obj: Any) -> type:
    """Check that ``obj`` is a method (``kind`` ``"method"``) or transform class with a dataclass ``options_cls``
    and register it under ``name``: the checks every plug-in and every built-in meets. A built-in's module
    registered it already with :func:`register_method` / :func:`register_transform` (under its class's
    ``name``, which must equal ``name``); another class under a taken name is refused, so is a name that is not
    a non-empty string."""
    table, base = (METHODS, Method) if kind == "method" else (TRANSFORMS, ClientTransform)
    cls = plugins.check_subclass(kind, name, obj, base)
    opts = getattr(cls, "options_cls", None)
    if not (isinstance(opts, type) and dataclasses.is_dataclass(opts)):
        returned_wrong(cls, kind, "options_cls", f"{_what(opts)}, not a dataclass (e.g. "
                       f"@dataclass class Options: mu: float = 0.01)", verb="is")
    if not (isinstance(name, str) and name):
        raise plugins.PluginError(f"{kind} plug-in {cls.__module__}.{cls.__qualname__} has no name (a class "
                                  f"attribute name = \"...\": the name configs use)")
    if table.get(name, cls) is not cls:
        raise ValueError(f"{kind} {name!r} registered twice: {table[name].__qualname__} and {cls.__qualname__}")
    table[name] = cls
    return cls


#: the ``pyproject.toml`` of a source tree this module runs from (``src/fedblend/algorithms/registry.py``)
SOURCE_PYPROJECT = Path(__file__).resolve().parents[3] / "pyproject.toml"


def builtin_entry_points(kind: str) -> dict[str, str]:
    """``{name: "package"}`` (or ``"module:Class"``) of fedblend's own entry points of ``kind``'s group (``"method"``:
    ``fedblend.methods``, ``"transform"``: ``fedblend.transforms``). Running from a source tree (a checkout, with
    or without ``pip install -e``), its ``pyproject.toml`` declares them: the installed metadata may be older
    (``pyproject.toml`` edited since the install) or another checkout's (an editable install elsewhere, this tree
    first on ``PYTHONPATH``). An installed package (a wheel) has no source tree: its metadata. Neither: an
    ``ImportError`` naming the fix."""
    group = plugins.GROUPS[kind]
    source = source_entry_points(group)
    if source:
        return source
    try:
        declared = {ep.name: ep.value for ep in metadata.distribution("fedblend").entry_points.select(group=group)}
    except metadata.PackageNotFoundError:
        declared = {}
    if declared:
        return declared
    raise ImportError(f"fedblend's built-in methods are declared as entry points of group {group!r} in its package "
                      f"metadata, and there is none (and no source tree's pyproject.toml at {SOURCE_PYPROJECT}): "
                      f"install fedblend with pip (pip install -e . in a checkout)")


def source_entry_points(group: str, path: Path | None = None) -> dict[str, str]:
    """``{name: value}`` of ``group`` in fedblend's ``pyproject.toml`` at ``path`` (default:
    :data:`SOURCE_PYPROJECT`; {} if there is none or it is another project's)."""
    path = path or SOURCE_PYPROJECT
    if not path.is_file():
        return {}
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    project = tomllib.loads(path.read_text()).get("project", {})
    return dict(project.get("entry-points", {}).get(group, {})) if project.get("name") == "fedblend" else {}


def load_builtins() -> None:
    """Import and register every built-in transform, then method, each through :func:`admit` (as a plug-in's)
    from fedblend's entry points: a package entry point (``fedblend = "fedblend.algorithms"``) through
    :func:`admit_package`, a ``"module:Class"`` one as a plug-in's path. A declaration that names a missing module
    or class, or a package that defines none, fails with the plug-in's one-line error."""
    for kind in ("transform", "method"):
        for name, value in sorted(builtin_entry_points(kind).items()):
            where = f"fedblend's entry point {name} = {value!r} of group {plugins.GROUPS[kind]!r}"
            if plugins.is_path(value):
                admit(kind, name, plugins.find(kind, value))
            else:
                admit_package(kind, value, where)


def _what(value: Any) -> str:
    return f"the class {value.__qualname__}" if isinstance(value, type) else f"a {type(value).__name__}"


def parse_method(spec: str) -> tuple[str, list[str]]:
    base, *parts = [s.strip() for s in spec.split("+")]
    if base not in METHODS and find_plugin("method", base) is None:
        raise ValueError(f"unknown method {base!r}; choose one of {sorted(METHODS)}, a plug-in's entry point "
                         f"(group fedblend.methods) or 'package.module:Class'")
    for p in parts:
        if p not in TRANSFORMS and find_plugin("transform", p) is None:
            raise ValueError(f"unknown transform {p!r} in {spec!r}; choose from {sorted(TRANSFORMS)}, a plug-in's "
                             f"entry point (group fedblend.transforms) or 'package.module:Class'")
    return base, parts


def load_all_plugins() -> dict[str, str]:
    """Load every method and transform an installed package declares (for listings); returns ``{kind name:
    error}`` for those that fail, instead of raising."""
    failed = {}
    for kind in ("method", "transform"):
        failed.update({f"{kind} package {name}": err for name, err in load_packages(kind).items()})
        for name in sorted(plugins.declared(kind)):
            try:
                find_plugin(kind, name)
            except plugins.PluginError as exc:
                failed[f"{kind} {name}"] = str(exc)
    return failed


def build_method(spec: str, options: Mapping[str, Any] | None = None,
                 transform_options: Mapping[str, Mapping[str, Any]] | None = None,
                 eval_choice: str | None = None) -> Method:
    """``build_method("fedprox+ala", {"mu": 0.01}, {"ala": {"eta": 1.0}})``; ``eval_choice``: the ``[eval] model``
    (None: the method's default; a ``ValueError`` for one it does not offer)."""
    base, parts = parse_method(spec)
    cls = METHODS[base]
    transforms = []
    for p in parts:  # a plug-in's construction is its own code: an exception in it is named (HookError)
        opts = make_options(TRANSFORMS[p].options_cls, (transform_options or {}).get(p), p)
        with guarded(TRANSFORMS[p], "transform", "__init__", passes=(ValueError,)):  # ValueError: a refusal
            transforms.append(TRANSFORMS[p](opts))
    opts = make_options(cls.options_cls, options, "options")
    with guarded(cls, "method", "__init__", passes=(ValueError,)):
        method = cls(opts, transforms)
    if transforms and not method.traits.accepts_transforms:
        raise ValueError(f"{spec!r}: {base} trains from a model of its own that no client transform can change; "
                         f"run it without {'+'.join(parts)}")
    for t in transforms:
        reason = transform_refusal(method, t)
        if reason:
            raise ValueError(f"{spec!r}: {reason}")
    return method.evaluating(eval_choice)


def transform_refusal(method: Method, transform: ClientTransform) -> str | None:
    """Why ``method`` cannot host ``transform`` (None: it can). A transform that blends the model a client receives
    with the client's own (``requires_received``: ALA, FedALA Eq. 4) needs a method whose clients train from a
    model the server sends, the global model or a personalized one (``traits.trains_from_received``)."""
    if transform.traits.requires_received and not method.traits.trains_from_received:
        return (f"{transform.name} blends the model the server sends a client with the client's own model, and "
                f"{method.name} has no global model and declares no personalized model its clients train from "
                f"(trait trains_from_received)")
    return None


def option_fields(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []
