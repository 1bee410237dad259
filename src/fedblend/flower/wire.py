"""What travels over Flower: batches of client jobs and their results as Flower records.

A batch for one node is one Flower ``Message`` whose content holds

* ``"jobs"``: an ``ArrayRecord`` -- the jobs (phase, client id, round, the fedblend message, the version of the
  client's state to start from) flattened by the state codec (:mod:`fedblend.common.codec`) into named arrays;
* ``"meta"``: a ``ConfigRecord`` -- the run key (which run's states on the node) and how many state versions the
  node keeps per client.

The reply holds ``"results"`` the same way. Nothing but named arrays and a few scalars crosses the wire; the
client's state never does (it stays on its node, see :mod:`fedblend.flower.node`).

Tensor shapes are checked on both ends (:func:`shape_errors`): a message whose model tensors do not have the
model's shapes is refused with a message naming the tensor, never trained on or aggregated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fedblend.common.codec import decode, encode
from fedblend.data.federated import ClientData

VERSION_KEY = "flower_state_version"  # the server's marker of a client state held on its node


def to_record(obj: Any) -> ArrayRecord:
    """``obj`` (state data: tensors, numbers, strings, dicts/lists) as a Flower ``ArrayRecord``. (``np.require``,
    not ``np.ascontiguousarray``, which turns a 0-dim tensor, e.g. PartialFed's layer strategy, into shape (1,).)"""
    return ArrayRecord({k: Array(np.require(v, requirements="C")) for k, v in encode(obj, as_numpy=True).items()})


def from_record(rec: ArrayRecord) -> Any:
    """Inverse of :func:`to_record` (tensors land on the CPU)."""
    return decode({k: a.numpy() for k, a in rec.items()}, "cpu")


def content(record: str, obj: Any, **meta: Any) -> RecordDict:
    """A message content: ``obj`` under ``record`` and the scalars ``meta`` under ``"meta"``."""
    return RecordDict({record: to_record(obj), "meta": ConfigRecord(dict(meta))})


def unpack(rd: RecordDict, record: str) -> tuple[Any, dict]:
    """``(obj, meta)`` of a content written by :func:`content`."""
    meta = dict(rd.config_records["meta"]) if "meta" in rd.config_records else {}
    return from_record(rd.array_records[record]), meta


def shape_errors(arrays: Any, shapes: Mapping[str, tuple], where: str = "") -> list[str]:
    """Every tensor in ``arrays`` (nested dicts / lists) stored under a model parameter's name whose shape is not
    that parameter's, as ``"path: shape X, expected Y"``."""
    out: list[str] = []
    if isinstance(arrays, Mapping):
        for k, v in arrays.items():
            path = f"{where}/{k}" if where else str(k)
            if isinstance(v, torch.Tensor):
                if k in shapes and tuple(v.shape) != tuple(shapes[k]):
                    out.append(f"{path}: shape {tuple(v.shape)}, expected {tuple(shapes[k])}")
            else:
                out += shape_errors(v, shapes, path)
    elif isinstance(arrays, (list, tuple)):
        for i, v in enumerate(arrays):
            out += shape_errors(v, shapes, f"{where}/{i}")
    return out


def fingerprint(data: ClientData) -> str:
    """A short digest of one client's data (labels of every split, sample shapes and the sum of the inputs): a
    node and the server that disagree on it hold different data for that client."""
    h = hashlib.sha256()
    for name in ("train_y", "test_y", "val_y", "train_x", "test_x"):
        t = getattr(data, name).detach().cpu()
        h.update(f"{name}{tuple(t.shape)}".encode())
        if name.endswith("_y"):
            h.update(t.contiguous().numpy().tobytes())
        else:
            h.update(f"{float(t.double().sum()):.6e}".encode())
    return h.hexdigest()[:16]
