"""Strict JSON for every results file: non-finite numbers are written as ``null``, never as bare ``NaN`` or
``Infinity`` (which strict JSON readers reject), and a non-finite number that slips through is an error.
Reading a JSON file a user hands over (a partition, a run's summary or metrics) fails with one line naming the
file, the place and the fix (:func:`read_json_object`, :func:`read_jsonl`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedblend.common.errors import UserFileError


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (also numpy / torch scalars) replaced by None, recursively."""
    if isinstance(obj, float) or type(obj).__name__ in ("float32", "float64", "float16"):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def dotted_keys(d: Mapping[str, Any] | None, prefix: str = "") -> dict[str, Any]:
    """A nested mapping (a config, a metrics row) flattened to dotted keys: ``{"a": {"b": 1}}`` ->
    ``{"a.b": 1}``; only mappings are descended into (lists stay values); None is empty."""
    out: dict[str, Any] = {}
    for k, v in (d or {}).items():
        if isinstance(v, Mapping):
            out.update(dotted_keys(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with non-finite numbers as null (``allow_nan=False`` guards the rest)."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)


def _read_text(path: Path, kind: str, fix: str) -> str:
    """The text of ``path``; :class:`UserFileError` naming the file when it cannot be read or is not text."""
    try:
        return path.read_text()
    except UnicodeDecodeError as exc:
        raise UserFileError(f"{path} is not a text ({kind}) file ({exc.reason}); {fix}") from exc
    except OSError as exc:
        raise UserFileError(f"cannot read {path}: {exc.strerror or exc}; {fix}") from exc


def read_json_object(path: str | Path, fix: str) -> dict[str, Any]:
    """The JSON object in file ``path``; :class:`UserFileError` naming the file, what is wrong (unreadable, not
    JSON -- with line and column --, not an object) and ``fix`` (what the user can do)."""
    path = Path(path)
    text = _read_text(path, "JSON", fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        what = "is empty" if not text.strip() else f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        raise UserFileError(f"{path} {what}; {fix}") from exc
    if not isinstance(data, dict):
        raise UserFileError(f"{path} holds a JSON {type(data).__name__}, not an object; {fix}")
    return data


def read_jsonl(path: str | Path, fix: str, partial_last: bool = False) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file (``metrics.jsonl``); blank lines skipped. ``partial_last``: a last
    line that is cut off (no newline at its end, not JSON: a run writing it right now) is left out instead of
    being an error. :class:`UserFileError` names the file, the line and ``fix``."""
    path = Path(path)
    text = _read_text(path, "JSON lines", fix)
    lines = text.split("\n")
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            last = i == len(lines)  # no newline after it
            if last and partial_last:
                break
            cut = " (cut off: was the run killed while writing it?)" if last else ""
            raise UserFileError(f"line {i} of {path} is not valid JSON{cut}: {exc.msg} at column {exc.colno}; "
                                f"{fix}") from exc
        if not isinstance(row, dict):
            raise UserFileError(f"line {i} of {path} holds a JSON {type(row).__name__}, not an object; {fix}")
        rows.append(row)
    return rows
