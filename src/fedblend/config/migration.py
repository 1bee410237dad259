"""Configs written by earlier versions: evaluation options that moved to ``[eval] model``, and option fields
added since a config was recorded (at their defaults, the behaviour runs had before)."""

from __future__ import annotations

from typing import Any

from fedblend.algorithms.registry import METHODS, TRANSFORMS, parse_method
from fedblend.common.options import ConfigError, from_table, to_table
from fedblend.common.plugins import PluginError
from fedblend.config.schema import LEGACY_EVAL, _plain


def migrate_eval(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``raw`` with the evaluation options of :data:`LEGACY_EVAL` (``[options] eval``, ``eval_global``, ``[ala]
    eval``) moved to ``[eval] model``, and the old spellings found (``["ala.eval = 'stored'"]``). A default value
    chooses nothing and is dropped; a ``ConfigError`` where two of them, or one and ``[eval] model``, differ."""
    method = raw.get("method", "fedavg")
    if not isinstance(method, str):
        return raw, []
    base, *parts = [s.strip() for s in method.split("+")]
    out, found, chosen = dict(raw), [], {}
    for table, legacy in [("options", LEGACY_EVAL.get(base))] + [(p, LEGACY_EVAL.get("+" + p)) for p in parts]:
        if legacy is None or not isinstance(out.get(table), dict) or legacy[0] not in out[table]:
            continue
        out[table] = dict(out[table])
        value = out[table].pop(legacy[0])
        found.append(f"{table}.{legacy[0]} = {value!r}")
        if value != legacy[1]:
            chosen[f"{table}.{legacy[0]}"] = value
    given = (out.get("eval") or {}).get("model") if isinstance(out.get("eval"), dict) else None
    if len(chosen) > 1 or (chosen and given is not None and given not in chosen.values()):
        both = ", ".join(f"{k} = {v!r}" for k, v in chosen.items())
        raise ConfigError(f"{both}{f' and eval.model = {given!r}' if given is not None else ''}: the evaluated model "
                          f"is one choice now, [eval] model; set it alone")
    if chosen:
        out["eval"] = {**(out.get("eval") or {}), "model": next(iter(chosen.values()))}
    return out, found


def with_new_defaults(resolved: dict[str, Any]) -> dict[str, Any]:
    """A recorded resolved config with the method's and transforms' option fields added since it was recorded
    filled in at their defaults. A new option's default keeps the behaviour runs had before it existed (the
    project's rule for adding one), so a run made before it resumes, and shares a report row, with runs that record
    it. Tables of a method or transform not registered here (a plug-in's) are left as they are."""
    out = dict(resolved)
    try:
        base, parts = parse_method(out.get("method", "fedavg"))
    except (ValueError, PluginError):
        return out
    for table, cls in [("options", METHODS.get(base))] + [(p, TRANSFORMS.get(p)) for p in parts]:
        given = out.get(table, {})
        if cls is None or not isinstance(given, dict):
            continue
        try:
            defaults = _plain(to_table(from_table(cls.options_cls, {}, table)))
        except (ConfigError, ValueError, TypeError):  # options without defaults for every field: nothing to add
            continue
        out[table] = {**defaults, **given}
    return out
