"""Explicit registry of methods and client transforms; ``"fedavg+ala"`` composes a method with transforms."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fedblend.common import plugins
from fedblend.common.guard import guarded, returned_wrong
from fedblend.common.options import from_table
from fedblend.core.method import ClientTransform, Method

METHODS: dict[str, type[Method]] = {}
TRANSFORMS: dict[str, type[ClientTransform]] = {}


def register_method(cls: type[Method]) -> type[Method]:
    if cls.name in METHODS:
        raise ValueError(f"method {cls.name!r} registered twice")
    METHODS[cls.name] = cls
    return cls


def register_transform(cls: type[ClientTransform]) -> type[ClientTransform]:
    if cls.name in TRANSFORMS:
        raise ValueError(f"transform {cls.name!r} registered twice")
    TRANSFORMS[cls.name] = cls
    return cls


def make_options(cls: type, values: Mapping[str, Any] | None, where: str) -> Any:
    """Build an options dataclass from a table, with errors naming the bad field and the allowed ones."""
    return from_table(cls, dict(values or {}), where)


def find_plugin(kind: str, name: str) -> type | None:
    """Method or transform ``name`` from a plug-in (``fedblend.common.plugins``: a ``"pkg.module:Class"`` path or
    an entry point of ``fedblend.methods`` / ``fedblend.transforms``), registered under ``name``; None if there
    is none. Built-in names win (they are in the registry already)."""
    table, base = (METHODS, Method) if kind == "method" else (TRANSFORMS, ClientTransform)
    if name in table:
        return table[name]
    obj = plugins.find(kind, name)
    if obj is None:
        return None
    cls = plugins.check_subclass(kind, name, obj, base)
    opts = getattr(cls, "options_cls", None)
    if not (isinstance(opts, type) and dataclasses.is_dataclass(opts)):
        returned_wrong(cls, kind, "options_cls", f"{_what(opts)}, not a dataclass (e.g. "
                       f"@dataclass class Options: mu: float = 0.01)", verb="is")
    table[name] = cls
    return cls


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
