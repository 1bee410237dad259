"""Messages: the only thing that crosses between a method's server half and its client halves.

Modelled on Flower's ``Message`` (a ``RecordDict`` of named ``ArrayRecord`` / ``MetricRecord`` /
``ConfigRecord``): ``arrays`` maps a record name to a parameter dictionary (``{"params": {...}}``; several
models travel as several records, e.g. FedFomo / APPLE), ``metrics`` holds numbers the receiver reports
(``num_samples``, accuracies), ``config`` holds instructions (the evaluation split). What a message costs on the
wire is the bytes of its tensors (:func:`comm_bytes`); numbers and strings are counted as free, as before.

The channels are enforced (:func:`channel_errors`, checked by the engine on every message both ways), with
Flower's record types as the rule, so that whatever runs in process also travels in a Flower ``Message``:
``arrays`` hold tensors only; ``metrics`` hold numbers (``int`` / ``float``) or flat lists of numbers; ``config``
holds numbers, strings, bytes, booleans or flat lists of one of those, and only downlink: it is the server's
instructions to a client, so a reply's config is empty (a client reports in ``metrics`` and ``arrays``).
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
    """One message of an exchange, server to client or a reply: ``arrays`` (named parameter records, ``{"params": {name:
    tensor}}``), ``metrics`` (numbers the sender reports: a training reply's ``num_samples``, an evaluation's counts) and
    ``config`` (the server's instructions, downlink only); the rules: module docstring."""

    arrays: dict[str, Params] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def params(self, record: str = "params") -> Params:
        """The parameter record ``record`` (``{}`` when the message carries none)."""
        return self.arrays.get(record, {})

    @property
    def num_bytes(self) -> int:
        """What the message costs on the wire: the bytes of its tensors."""
        return comm_bytes(self.arrays)

    def to_arrays(self) -> dict[str, Any]:
        """The message as flat named numpy arrays (:mod:`fedblend.common.codec`), e.g. for another process."""
        return encode({"arrays": self.arrays, "metrics": self.metrics, "config": self.config}, as_numpy=True)

    @classmethod
    def from_arrays(cls, flat: Mapping[str, Any], device: str | torch.device | None = None) -> Message:
        """The message that :meth:`to_arrays` wrote, its tensors on ``device``."""
        d = decode(flat, device)
        return cls(d["arrays"], d["metrics"], d["config"])


_NUMBER = (int, float)
_CONFIG_VALUE = (int, float, str, bytes, bool)


def _flat(value: Any, kinds: tuple[type, ...]) -> bool:
    """``value`` is one of ``kinds`` or a flat list / tuple of them (booleans count as numbers only in config)."""
    def ok(v: Any) -> bool:
        return isinstance(v, kinds) and (bool in kinds or not isinstance(v, bool))

    return ok(value) or (isinstance(value, (list, tuple)) and all(ok(v) for v in value))


def channel_errors(msg: Message, reply: bool) -> list[str]:
    """What in ``msg`` breaks the channel rules (module docstring): one line per offending entry; ``reply``:
    the message goes from a client to the server (its config must be empty)."""
    errors = []
    for record, params in msg.arrays.items():
        if not isinstance(params, Mapping):
            errors.append(f"arrays[{record!r}] is a {type(params).__name__}: arrays map record names to "
                          f"{{name: tensor}} dicts")
            continue
        errors += [f"arrays[{record!r}][{name!r}] is a {type(t).__name__}: arrays hold tensors only"
                   for name, t in params.items() if not isinstance(t, torch.Tensor)]
    errors += [f"metrics[{k!r}] is a {type(v).__name__}: metrics hold numbers or flat lists of numbers "
               f"(tensors go in arrays)" for k, v in msg.metrics.items() if not _flat(v, _NUMBER)]
    if reply and msg.config:
        errors.append(f"a reply carries config {sorted(msg.config)}: config is the server's instructions to a "
                      f"client; a client reports in metrics (numbers) and arrays (tensors)")
    else:
        errors += [f"config[{k!r}] is a {type(v).__name__}: config holds numbers, strings, bytes, booleans or "
                   f"flat lists of them" for k, v in msg.config.items() if not _flat(v, _CONFIG_VALUE)]
    return errors


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
