"""The reply contract: what a client's training reply must be before the server half aggregates it.

The channel rules (:func:`~fedblend.core.message.channel_errors`) say what kinds of values a message may hold;
this module says what a training reply means, as far as that can be checked without knowing the method:

* it is a :class:`~fedblend.core.message.Message` (a ``reply`` hook that forgot to ``return`` gives ``None``);
* a tensor stored under the name of a model parameter, in any record, has that parameter's shape and a floating
  dtype (a bias of shape ``[1]`` where the model's is ``[10]`` would otherwise be broadcast silently by the
  model's forward pass, and the run would "finish");
* the records that hold model parameters (``Method.param_records``, ``("params",)`` by default) name only
  parameters of the model, or the entries the method declares besides them (``Method.extra_entries``); other
  records (DBE's ``"dbe"``, FedProto's ``"protos"``, FedPAC's ``"fedpac"``) hold what their method likes;
* ``metrics["num_samples"]``, where present, is a positive finite number (the aggregation's weight); ``0`` only
  from a client that holds no training samples.

The engine checks every reply of a training phase (:mod:`fedblend.core.engine`), the client runtime refuses a
client half that returns no Message, and :mod:`fedblend.testing` runs the same check, so a plug-in's mistake is
named -- method, client, round, record, entry -- where it is made, not as a traceback deep in aggregation.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from typing import Any

import torch

from fedblend.common.errors import MessageError
from fedblend.core.message import Message


def _shape(t: torch.Tensor | torch.Size | tuple) -> str:
    return str(list(t.shape if isinstance(t, torch.Tensor) else t))


def reply_errors(reply: Any, model: Mapping[str, torch.Tensor], param_records: Collection[str] = ("params",),
                 extra_entries: Collection[str] = (), num_train: int | None = None) -> list[str]:
    """What in the training ``reply`` breaks the reply contract (module docstring), one line per offending
    entry. ``model``: the model's parameters (name -> tensor, for their shapes); ``num_train``: the client's
    training samples, where known (a client without any may report ``num_samples = 0``)."""
    if not isinstance(reply, Message):
        return [f"the reply is {_what(reply)}, not a fedblend Message: the client half (its reply hook) must "
                f"return a Message, e.g. Message({{'params': shared}}, {{'num_samples': n}})"]
    errors: list[str] = []
    for record, entries in reply.arrays.items():
        if not isinstance(entries, Mapping):
            continue  # a channel error, named by channel_errors
        for name, t in entries.items():
            where = f"{record}[{name!r}]"
            if name in model:
                if not isinstance(t, torch.Tensor):
                    continue  # a channel error
                if tuple(t.shape) != tuple(model[name].shape):
                    errors.append(f"{where} has shape {_shape(t)}, the model's is {_shape(model[name])}")
                if not t.is_floating_point():
                    errors.append(f"{where} has dtype {t.dtype}: model parameters are floating point")
            elif record in param_records and name not in extra_entries:
                errors.append(f"{where} is not a parameter of the model (it has {_names(model)}); a method that "
                              f"sends other entries in its {record!r} record declares them in extra_entries")
    if "num_samples" in reply.metrics:
        n = reply.metrics["num_samples"]
        number = isinstance(n, (int, float)) and not isinstance(n, bool)
        if not number or not math.isfinite(n) or n < 0 or (n == 0 and num_train != 0):
            errors.append(f"metrics['num_samples'] is {n!r}: it must be a positive number (the client's training "
                          f"samples, the weight of its update)")
    return errors


def check_reply(reply: Any, label: str, cid: int, rnd: int, phase: str, model: Mapping[str, torch.Tensor],
                param_records: Collection[str] = ("params",), extra_entries: Collection[str] = (),
                num_train: int | None = None) -> None:
    """Raise :class:`~fedblend.common.errors.MessageError` naming the method (``label``), the client, the round
    (``rnd``: 0-based, reported 1-based) and every offending entry, where :func:`reply_errors` finds any."""
    errors = reply_errors(reply, model, param_records, extra_entries, num_train)
    if errors:
        raise MessageError(f"{where_reply(label, cid, rnd, phase)}: " + "; ".join(errors))


def check_is_message(reply: Any, label: str, cid: int, rnd: int, phase: str) -> None:
    """Only the first rule: ``reply`` is a Message (what every runtime checks before it touches the reply)."""
    if not isinstance(reply, Message):
        check_reply(reply, label, cid, rnd, phase, {})


def where_reply(label: str, cid: int, rnd: int, phase: str) -> str:
    """``"fedavg: client 3's reply in round 2"`` (the phase named where it is not the default ``"train"``)."""
    kind = "reply" if phase == "train" else f"{phase} reply"
    return f"{label}: client {cid}'s {kind} in round {rnd + 1}"


def _what(value: Any) -> str:
    return "None" if value is None else f"a {type(value).__name__}"


def _names(model: Mapping[str, Any]) -> str:
    names = list(model)
    return ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")


def model_errors(params: Any, model: Mapping[str, torch.Tensor]) -> list[str]:
    """What keeps ``params`` from being a whole model like ``model`` (name -> tensor): not a dict of tensors, a
    parameter missing (the model's own initial weights would be used in its place, silently) or extra, a shape
    that differs or a dtype that is not floating; one line per finding."""
    if not isinstance(params, Mapping):
        return [f"it is {_what(params)}, not a dict of the model's parameters"]
    errors = []
    missing = [n for n in model if n not in params]
    extra = [n for n in params if n not in model]
    if missing:
        errors.append(f"missing {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
    if extra:
        errors.append(f"{', '.join(map(str, extra[:4]))}{' ...' if len(extra) > 4 else ''} not in the model "
                      f"(it has {_names(model)})")
    for name, t in params.items():
        if name not in model:
            continue
        if not isinstance(t, torch.Tensor):
            errors.append(f"{name!r} is {_what(t)}, not a tensor")
        elif tuple(t.shape) != tuple(model[name].shape):
            errors.append(f"{name!r} has shape {_shape(t)}, the model's is {_shape(model[name])}")
        elif not t.is_floating_point():
            errors.append(f"{name!r} has dtype {t.dtype}: model parameters are floating point")
    return errors
