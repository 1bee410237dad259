"""``fedblend methods [NAME]``: the registered methods and transforms (plug-ins included) with their options; with
NAME, one's options with defaults, allowed values and help, and the models its ``[eval] model`` can score."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import textwrap

from fedblend.algorithms import METHODS, TRANSFORMS
from fedblend.cli import args as cli_args
from fedblend.common.errors import ConfigError


def add_parser(sub) -> None:
    meth = sub.add_parser("methods", help="list methods, transforms and their options; with NAME, its options "
                                          "with defaults, allowed values and help")
    meth.add_argument("name", nargs="?", help="a method or transform (e.g. fedapa, ala)")
    cli_args.debug(meth)


def command(args: argparse.Namespace) -> int:
    if args.name:
        print(method_help(args.name), end="")
        return 0
    from fedblend.algorithms.registry import load_all_plugins

    failed = load_all_plugins()  # installed packages' entry points (fedblend.methods / fedblend.transforms)
    for name, cls in sorted(METHODS.items()):
        opts = {f.name: f.default for f in dataclasses.fields(cls.options_cls)}
        print(f"{name:12s} {opts}  -- {cls.paper}{plugin_note(cls)}")
    for name, cls in sorted(TRANSFORMS.items()):
        opts = {f.name: f.default for f in dataclasses.fields(cls.options_cls)}
        print(f"+{name:11s} {opts}{plugin_note(cls)}")
    for what, err in failed.items():
        print(f"fedblend: warning: {what} cannot be used: {err}", file=sys.stderr)
    return 0


def method_help(name: str) -> str:
    """A method's or transform's options: default, allowed values and each field's help (its ``help``
    metadata)."""
    import inspect

    from fedblend.algorithms.registry import find_plugin

    key = name.lstrip("+")
    cls = METHODS.get(key) or TRANSFORMS.get(key) or find_plugin("method", key) or find_plugin("transform", key)
    if cls is None:
        raise ConfigError(f"no method or transform {name!r}; methods: {', '.join(sorted(METHODS))}; transforms: "
                          f"{', '.join(sorted(TRANSFORMS))} (and plug-ins: fedblend methods lists them)")
    where = "options" if key in METHODS else key
    head = f"{key}" + (f" -- {cls.paper}" if getattr(cls, "paper", None) else "") + plugin_note(cls)
    doc = inspect.cleandoc(cls.__dict__.get("__doc__") or "").split("\n\n")[0]
    lines = [head, *(["", doc] if doc else []), "", f"[{where}] table (in the config, or --set {where}.NAME=VALUE):"]
    lines += _option_lines(cls.options_cls)
    if key in METHODS:  # which of its models a run evaluates: [eval] model (the first is the default)
        from fedblend.algorithms.registry import build_method

        lines += ["", "[eval] model (which model the personalized accuracy scores; the first is the default):"]
        for choice, what in build_method(key).eval_choices().items():
            lines += [f"  {choice!r}"] + [f"      {ln}" for ln in textwrap.wrap(what, 100)]
    return "\n".join(lines).replace("`", "") + "\n"


def _option_lines(opts: type) -> list[str]:
    """One line per option of the options dataclass ``opts`` (default and allowed values), its help wrapped below."""
    from fedblend.common.options import allowed_text

    helps = field_help(opts)
    lines = []
    for f in dataclasses.fields(opts):
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else None)
        lines.append(f"  {f.name} = {default!r}    ({allowed_text(opts, f.name)})")
        if helps.get(f.name):
            lines += [f"      {ln}" for ln in textwrap.wrap(helps[f.name], 100)]
    if not dataclasses.fields(opts):
        lines.append("  (none)")
    return lines


def plugin_note(cls: type) -> str:
    """`` [plug-in: module]`` for a method or transform that is not part of fedblend."""
    mod = getattr(cls, "__module__", "")
    return "" if mod.startswith("fedblend.") else f"  [plug-in: {mod}]"


def field_help(cls: type) -> dict[str, str]:
    """``{field: help}`` of an options dataclass, from each field's ``metadata["help"]`` (written with
    :func:`fedblend.common.options.opt` or ``dataclasses.field(metadata={"help": ...})``); fields without one
    are left out."""
    fields = dataclasses.fields(cls) if dataclasses.is_dataclass(cls) else ()
    return {f.name: str(f.metadata["help"]) for f in fields if f.metadata.get("help")}
