"""Strict JSON for every results file: non-finite numbers are written as ``null``, never as bare ``NaN`` or
``Infinity`` (which strict JSON readers reject), and a non-finite number that slips through is an error."""

from __future__ import annotations

import json
import math
from typing import Any


def finite_or_none(obj: Any) -> Any:
    """``obj`` with every non-finite float (also numpy / torch scalars) replaced by None, recursively."""
    if isinstance(obj, float) or type(obj).__name__ in ("float32", "float64", "float16"):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def dumps(obj: Any, **kwargs: Any) -> str:
    """``json.dumps`` of ``obj`` with non-finite numbers as null (``allow_nan=False`` guards the rest)."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kwargs)
