"""The tables of ``docs/config.md``: every field a run config accepts with its default and allowed values, from the
code (types, ``CHOICES``, ``RANGES``), so the documented ranges cannot drift from the checked ones."""

from __future__ import annotations

import dataclasses
from typing import Any

from fedblend.algorithms.registry import METHODS, TRANSFORMS
from fedblend.config.schema import SCALAR_CHOICES, SCALAR_RANGES, SCALARS, TABLES, RunConfig

SCALAR_ALLOWED = {"method": "a registered method, optionally `+transform` (`fedblend methods`)",
                  "name": "string"}


def _fmt_default(v: Any) -> str:
    if v is None:
        return "unset"
    if isinstance(v, bool):
        return "`true`" if v else "`false`"
    if isinstance(v, str):
        return f'`"{v}"`'
    if isinstance(v, (list, tuple)):
        return "`[" + ", ".join(map(str, v)) + "]`"
    return f"`{v!r}`"


def _scalar_allowed(name: str) -> str:
    if name in SCALAR_ALLOWED:
        return SCALAR_ALLOWED[name]
    if name in SCALAR_CHOICES:
        return " / ".join(f"`{c}`" for c in SCALAR_CHOICES[name])
    return f"{SCALARS[name].__name__} {SCALAR_RANGES[name]}" if name in SCALAR_RANGES else SCALARS[name].__name__


def field_docs() -> dict[str, list[tuple[str, str, str, str]]]:
    """``{section heading: [(field, default, allowed, meaning), ...]}`` for every field a run config accepts, from
    the code (types, ``CHOICES``, ``RANGES``, and each field's documentation,
    :func:`fedblend.common.options.field_doc`): ``docs/config.md``'s tables are generated from these
    (``python bookkeeping/gen_docs.py``; ``tests/test_config_docs.py`` fails when they are stale), so the
    documented ranges cannot drift from the checked ones."""
    from fedblend.common.options import allowed_text, field_doc

    default = RunConfig()
    out = {"Top level": [(k, _fmt_default(getattr(default, k)), _scalar_allowed(k), field_doc(RunConfig, k))
                         for k in SCALARS]}

    def table(cls: type) -> list[tuple[str, str, str, str]]:
        return [(f.name, _fmt_default(f.default), allowed_text(cls, f.name), field_doc(cls, f.name))
                for f in dataclasses.fields(cls)]

    for name, cls in TABLES.items():
        out[f"`[{name}]`"] = table(cls)
    for name, mcls in sorted(METHODS.items()):
        if dataclasses.fields(mcls.options_cls):
            out[f"`[options]` of `{name}`"] = table(mcls.options_cls)
    for name, tcls in sorted(TRANSFORMS.items()):
        if dataclasses.fields(tcls.options_cls):
            out[f"`[{name}]` (transform `+{name}`)"] = table(tcls.options_cls)
    return out
