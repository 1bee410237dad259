"""What identifies a resolved config (its hash, without the runtime-only fields) and what differs between two."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from fedblend.common.jsonio import dotted_keys
from fedblend.config.schema import RUNTIME_ONLY


def config_hash(resolved: dict[str, Any]) -> str:
    """Short sha256 of a resolved config without the runtime-only fields (same results, same hash)."""
    core = {k: v for k, v in resolved.items() if k not in RUNTIME_ONLY}
    text = json.dumps(core, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_diff(old: dict[str, Any], new: dict[str, Any], ignore: tuple[str, ...] = ()) -> list[str]:
    """``"field: old -> new"`` for every dotted field that differs between two resolved configs."""
    a, b = dotted_keys(old), dotted_keys(new)
    return [f"{k}: {a.get(k, '(unset)')!r} -> {b.get(k, '(unset)')!r}" for k in sorted(set(a) | set(b))
            if k not in ignore and k.split(".")[0] not in ignore and a.get(k, _UNSET) != b.get(k, _UNSET)]


_UNSET = object()
