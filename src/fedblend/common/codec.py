"""One codec for all state: a nested state <-> a flat dictionary of named arrays.

Server and client states, messages and checkpoints hold only tensors, numbers, strings, booleans, ``None`` and
nested dicts / lists / tuples of them (DESIGN principle 4). :func:`encode` flattens such a value into
``{name: array}`` -- what Flower's ``ArrayRecord``, an ``.npz`` file or a pipe to a worker process carry -- and
:func:`decode` rebuilds it exactly:

* every tensor becomes one array named by its path (``"ala/weights/fc.weight"``), with its dtype kept;
* the structure (dict keys with their types, lists, tuples, scalars, non-finite floats) is one JSON document
  stored as a ``uint8`` array under :data:`TREE`, so the result is *only* named arrays;
* a tensor object that appears twice is stored once and decoded as one object again (an evaluation message
  that carries the same global model under two names costs one copy).

``numpy`` arrays are kept as such (``as_numpy=True`` returns numpy arrays for every entry, e.g. for pickling to
a worker or writing ``.npz``). Anything else (a function, an arbitrary object) is an error naming its path, so
hidden state cannot slip into a checkpoint.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

TREE = "__tree__"
_NUMPY_ONLY = {torch.bfloat16: torch.int16}  # dtypes numpy cannot hold, shipped as same-size integers


class CodecError(TypeError):
    """A value that is not state data (names the path where it was found)."""


def to_device(state: Any, device: str | torch.device) -> Any:
    """``state`` with every tensor on ``device``: the same object where nothing moves (a tensor already there is
    not copied), and a tensor that appears twice moved once (it stays one object, as :func:`decode` keeps it).
    The engine holds every server and client state and every message on the run's device with this, so a state
    or message a method builds from CPU tensors (``torch.zeros(n)``, a generator's draw, a numpy result) meets
    the model's tensors on a GPU."""
    moved: dict[int, torch.Tensor] = {}

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            if id(x) not in moved:
                moved[id(x)] = x.to(device)
            return moved[id(x)]
        if isinstance(x, dict):
            out = {k: walk(v) for k, v in x.items()}
            return x if all(out[k] is x[k] for k in x) else out
        if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
            items = [walk(v) for v in x]
            return x if all(a is b for a, b in zip(items, x)) else type(x)(items)
        return x

    return walk(state)


def encode(state: Any, as_numpy: bool = False) -> dict[str, Any]:
    """Flatten ``state`` to ``{name: tensor}`` (``{name: ndarray}`` with ``as_numpy``) plus the structure."""
    arrays: dict[str, Any] = {}
    seen: dict[int, str] = {}

    def put(name: str, t: torch.Tensor) -> dict:
        if id(t) in seen:
            return {"t": seen[id(t)]}
        key = f"{len(arrays)}:{name}"
        seen[id(t)] = key
        t = t.detach()
        if as_numpy:
            cpu = t.cpu().contiguous()
            if cpu.dtype in _NUMPY_ONLY:
                cpu = cpu.view(_NUMPY_ONLY[cpu.dtype])
            arrays[key] = cpu.numpy()
        else:
            arrays[key] = t
        return {"t": key, "dtype": str(t.dtype).removeprefix("torch."), "device": str(t.device)}

    def walk(v: Any, path: str) -> Any:
        if isinstance(v, torch.Tensor):
            return put(path, v)
        if isinstance(v, np.ndarray):
            arrays_key = f"{len(arrays)}:{path}"
            arrays[arrays_key] = v if as_numpy else torch.from_numpy(np.ascontiguousarray(v))
            return {"np": arrays_key}
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
            return int(v)
        if isinstance(v, (float, np.floating)):
            v = float(v)
            return v if math.isfinite(v) else {"f": repr(v)}
        if isinstance(v, Mapping):
            items = []
            for k, x in v.items():
                if not isinstance(k, (str, int)) or isinstance(k, bool):
                    raise CodecError(f"{path or '<root>'}: dict key {k!r} is not a string or an integer")
                items.append([k, walk(x, f"{path}/{k}" if path else str(k))])
            return {"d": items}
        if isinstance(v, (list, tuple)):
            out = [walk(x, f"{path}/{i}") for i, x in enumerate(v)]
            return {"l": out} if isinstance(v, list) else {"u": out}
        raise CodecError(f"{path or '<root>'}: {type(v).__name__} is not state data (tensors, numbers, strings, "
                         "None and dicts/lists of them)")

    tree = walk(state, "")
    arrays[TREE] = np.frombuffer(json.dumps(tree).encode(), dtype=np.uint8).copy()
    if not as_numpy:
        arrays[TREE] = torch.from_numpy(arrays[TREE])
    return arrays


def decode(arrays: Mapping[str, Any], device: str | torch.device | None = None) -> Any:
    """Inverse of :func:`encode` (accepts tensors or numpy arrays). ``device`` overrides where tensors land."""
    raw = arrays[TREE]
    raw = raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    tree = json.loads(raw.tobytes().decode())
    made: dict[str, torch.Tensor] = {}

    def tensor(node: dict) -> torch.Tensor:
        key = node["t"]
        if key in made:
            return made[key]
        a = arrays[key]
        if isinstance(a, torch.Tensor):
            t = a
        else:  # share a writable buffer (e.g. just unpickled); copy a read-only one
            a = np.asarray(a)
            t = torch.from_numpy(a if a.flags.writeable else a.copy())
        dtype = getattr(torch, node["dtype"])
        if t.dtype != dtype:
            t = t.view(dtype)
        t = t.to(device if device is not None else node["device"])
        made[key] = t
        return t

    def walk(n: Any) -> Any:
        if not isinstance(n, (dict, list)):
            return n
        if isinstance(n, list):  # never produced by encode (lists are tagged), kept for robustness
            return [walk(x) for x in n]
        if "t" in n:
            return tensor(n)
        if "np" in n:
            a = arrays[n["np"]]
            return a.numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        if "f" in n:
            return float(n["f"])
        if "d" in n:
            return {k: walk(x) for k, x in n["d"]}
        if "l" in n:
            return [walk(x) for x in n["l"]]
        if "u" in n:
            return tuple(walk(x) for x in n["u"])
        raise CodecError(f"unknown node {n!r}")

    return walk(tree)
