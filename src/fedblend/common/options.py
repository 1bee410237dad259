"""Typed option tables: build a dataclass from a dict, with errors that name the field and what is allowed.

Used for the run config's tables and for every method's / transform's options, so a typo such as
``[train] lrr = 0.1`` fails up front with ``unknown field 'train.lrr'; allowed: batch_size, epochs, ...``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Union

from fedblend.common.errors import ConfigError

__all__ = ["ConfigError", "Range", "allowed_text", "check_value", "from_table", "to_table"]


@dataclass(frozen=True)
class Range:
    """An allowed numeric range, written as in the docs: ``"> 0"``, ``">= 1"``, ``"[0, 1)"``, ``"(0, 1]"``."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    @classmethod
    def parse(cls, text: str) -> Range:
        """The range written as ``"> 0"``, ``"[0, 1)"``, ... (a ``ValueError`` otherwise)."""
        text = text.strip()
        num = r"(-?[\d.]+(?:e-?\d+)?)"
        m = re.fullmatch(rf"(>=|>|<=|<)\s*{num}", text)
        if m:
            op, v = m.group(1), _number(m.group(2))
            return cls(lo=v, lo_open=op == ">") if op[0] == ">" else cls(hi=v, hi_open=op == "<")
        m = re.fullmatch(rf"([\[(])\s*{num}\s*,\s*{num}\s*([\])])", text)
        if not m:
            raise ValueError(f"not a range: {text!r}")
        return cls(_number(m.group(2)), _number(m.group(3)), m.group(1) == "(", m.group(4) == ")")

    def __contains__(self, v: float) -> bool:
        if isinstance(v, float) and not math.isfinite(v):  # nan and inf are never a valid setting
            return False
        if self.lo is not None and (v < self.lo or (self.lo_open and v == self.lo)):
            return False
        return not (self.hi is not None and (v > self.hi or (self.hi_open and v == self.hi)))

    def __str__(self) -> str:
        def num(x: float) -> str:
            return str(x) if isinstance(x, int) else str(int(x)) if float(x).is_integer() else repr(x)

        if self.lo is not None and self.hi is not None:
            return f"{'(' if self.lo_open else '['}{num(self.lo)}, {num(self.hi)}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {num(self.lo)}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {num(self.hi)}"
        return "any"


def _number(text: str) -> int | float:
    """A range bound: an int when written as one (exact for large bounds), else a float."""
    return int(text) if re.fullmatch(r"-?\d+", text) else float(text)


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
        if "\x00" in value:  # no file name, option or label holds one
            raise ConfigError(f"{where} must not contain a NUL character, got {value!r}")
    if choices is not None and value not in choices:
        raise ConfigError(f"{where} must be one of {list(choices)}, got {value!r}")
    return value


def check_value(value: Any, tp: Any, where: str, choices: tuple | None = None, rng: str | None = None) -> Any:
    """``value`` checked against its type, its choices and its range (``rng``, e.g. ``"> 0"``); returns it
    converted (ints to floats for float fields, lists to tuples for tuple fields)."""
    value = _check(value, tp, where, choices)
    if rng is not None and value is not None:
        r = Range.parse(rng)
        for i, v in enumerate(value if isinstance(value, (list, tuple)) else [value]):
            if v not in r:
                at = f"{where}[{i}]" if isinstance(value, (list, tuple)) else where
                finite = "a finite number " if isinstance(v, float) and not math.isfinite(v) else ""
                raise ConfigError(f"{at} must be {finite}{r}, got {v!r}")
    elif isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where} must be a finite number, got {value!r}")
    return value


def allowed_text(cls: type, name: str) -> str:
    """What field ``name`` of options dataclass ``cls`` accepts, as written in ``docs/config.md``'s
    "allowed" column: its choices, its range, ``true / false``, or the type; ``, or unset`` when it may be
    omitted with no default value."""
    tp = typing.get_type_hints(cls)[name]
    choices = getattr(cls, "CHOICES", {}).get(name)
    rng = getattr(cls, "RANGES", {}).get(name)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = typing.get_origin(tp) in (Union, types.UnionType) and len(args) < len(typing.get_args(tp))
    base = args[0] if optional else tp
    if choices is not None:
        text = " / ".join(f"`{c}`" for c in choices)
    elif base is bool:
        text = "`true` / `false`"
    elif typing.get_origin(base) in (list, tuple):
        inner = typing.get_args(base)[0].__name__
        text = f"list of {inner}" + (f" {rng}" if rng else "")
    else:
        text = f"{base.__name__}" + (f" {rng}" if rng else "")
    return text + (", or unset" if optional else "")


def from_table(cls: type, table: dict[str, Any] | None, where: str) -> Any:
    """Instantiate dataclass ``cls`` from ``table``; field choices come from ``cls.CHOICES`` and numeric ranges
    from ``cls.RANGES`` (``{"lr": "> 0"}``) if defined, then ``obj.validate(where)`` checks cross-field rules."""
    table = dict(table or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        allowed = ", ".join(sorted(fields)) or "(none)"
        raise ConfigError(f"unknown field {where + '.' if where else ''}{unknown[0]}; allowed: {allowed}")
    hints = typing.get_type_hints(cls)
    choices = getattr(cls, "CHOICES", {})
    ranges = getattr(cls, "RANGES", {})
    values = {k: check_value(v, hints[k], f"{where}.{k}" if where else k, choices.get(k), ranges.get(k))
              for k, v in table.items()}
    try:
        obj = cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(where)
    return obj


def to_table(obj: Any) -> dict[str, Any]:
    """An options value as a plain dict (a dataclass's fields, or the mapping itself)."""
    return dataclasses.asdict(obj) if dataclasses.is_dataclass(obj) else dict(obj)


def opt(default: Any, help: str, file: bool = False) -> Any:  # noqa: A002 (the dataclasses metadata key)
    """A documented option field, ``dataclasses.field(default=default, metadata={"help": help})``: the help is
    what ``fedblend methods NAME`` prints and ``docs/config.md`` lists (plug-ins use the same). ``file``: the
    value is a path the run reads (``""``: none), so the run records the file's sha256 beside its config
    (:func:`file_fields`, ``fedblend.experiment.run_identity``)."""
    return dataclasses.field(default=default, metadata={"help": help, **({"file": True} if file else {})})


def file_fields(options_cls: type) -> list[str]:
    """The fields of an options dataclass declared ``opt(..., file=True)``: paths to files the run reads."""
    return [f.name for f in dataclasses.fields(options_cls) if f.metadata.get("file")]


def field_doc(cls: type, name: str) -> str:
    """The documentation of field ``name`` of the dataclass ``cls``, as ``docs/config.md``'s meaning column and
    the API reference show it: its ``help`` metadata (:func:`opt`), else the ``#:`` comment lines right above the
    field in the source of ``cls`` or a base class (``""`` if neither)."""
    for f in dataclasses.fields(cls):
        if f.name == name and f.metadata.get("help"):
            return str(f.metadata["help"])
    for klass in cls.__mro__:
        doc = doc_comments(klass).get(name)
        if doc:
            return doc
    return ""


def doc_comments(cls: type) -> dict[str, str]:
    """``{attribute: text}`` of the ``#:`` comments right above the annotated attributes in the body of ``cls``
    (the Sphinx / pdoc convention; lines joined with spaces); {} where the source cannot be read."""
    import inspect

    try:
        lines, _ = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    block: list[str] = []
    for line in lines[1:]:
        text = line.strip()
        if text.startswith("#:"):
            block.append(text[2:].strip())
            continue
        m = re.match(r"([A-Za-z_]\w*)\s*:", text)
        if m and block:
            out[m.group(1)] = " ".join(block)
        block = []
    return out
