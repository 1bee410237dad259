"""Messages: the only thing that crosses between a method's server half and its client halves.

Modelled on Flower's ``Message`` (a ``RecordDict`` of named ``ArrayRecord`` / ``MetricRecord`` /
``ConfigRecord``): ``arrays`` maps a record name to a parameter dictionary (``{"params": {...}}``; several
models travel as several records, e.g. FedFomo / APPLE), ``metrics`` holds numbers the receiver reports
(``num_samples``, accuracies), ``config`` holds instructions (the evaluation split). What a message costs on the
wire is the bytes of its tensors (:func:`comm_bytes`); numbers and strings are counted as free, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from fedblend.common.codec import decode, encode
from fedblend.common.params import Params


@dataclass
class Message:
    arrays: dict[str, Params] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def params(self, record: str = "params") -> Params:
        """The parameter record ``record`` (``{}`` when the message carries none)."""
        return self.arrays.get(record, {})

    @property
    def num_bytes(self) -> int:
        return comm_bytes(self.arrays)

    def to_arrays(self) -> dict[str, Any]:
        """The message as flat named numpy arrays (:mod:`fedblend.common.codec`), e.g. for another process."""
        return encode({"arrays": self.arrays, "metrics": self.metrics, "config": self.config}, as_numpy=True)

    @classmethod
    def from_arrays(cls, flat: Mapping[str, Any], device: str | torch.device | None = None) -> Message:
        d = decode(flat, device)
        return cls(d["arrays"], d["metrics"], d["config"])


def first_nonfinite(arrays: Mapping[str, Params]) -> str | None:
    """``"record.tensor"`` of the first floating-point tensor in ``arrays`` holding NaN or inf, else None."""
    for record, params in arrays.items():
        for name, t in params.items():
            if isinstance(t, torch.Tensor) and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                return f"{record}.{name}"
    return None


def first_nonfinite_value(obj: Any, path: str = "") -> str | None:
    """The path (``"personal.fc1.weight"``) of the first NaN / inf inside a state: a floating-point tensor or a
    float, in nested dicts / lists / tuples; None when every value is finite."""
    if isinstance(obj, torch.Tensor):
        return path or "." if obj.is_floating_point() and not bool(torch.isfinite(obj).all()) else None
    if isinstance(obj, float):
        return path or "." if not math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return None
    for k, v in items:
        where = first_nonfinite_value(v, f"{path}.{k}" if path else str(k))
        if where is not None:
            return where
    return None


def comm_bytes(obj: Any) -> int:
    """Bytes of every tensor inside ``obj`` (nested dicts / lists), i.e. what a message costs on the wire."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Message):
        return comm_bytes(obj.arrays)
    if isinstance(obj, Mapping):
        return sum(comm_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(comm_bytes(v) for v in obj)
    return 0
