"""Parameter dictionaries (``name -> tensor``) and the operations every method shares.

A model's parameters are handled as an ordered ``dict[str, Tensor]`` (the ``torch.func`` convention), so
server aggregation, blending and client training are plain functions over dictionaries. The layer of a
parameter is its name without the last component (``"fc1.weight" -> "fc1"``); a model declares its ordered
layers and which of them form the head (see :mod:`fedblend.models.zoo`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch

Params = dict[str, torch.Tensor]


def layer_of(name: str) -> str:
    """Layer a parameter belongs to: ``"conv1.weight" -> "conv1"``."""
    return name.rsplit(".", 1)[0]


def clone(params: Mapping[str, torch.Tensor]) -> Params:
    """A detached copy of every tensor."""
    return {k: v.detach().clone() for k, v in params.items()}


def select(params: Mapping[str, torch.Tensor], names: Iterable[str]) -> Params:
    """The entries of ``params`` named in ``names``, in that order (the same tensors)."""
    return {k: params[k] for k in names}


def weighted_average(models: Sequence[Mapping[str, torch.Tensor]], weights: Sequence[float]) -> Params:
    """``sum_k w_k theta_k / sum_k w_k`` per tensor (FedAvg, McMahan et al. 2017, Alg. 1).

    Every model must hold the first one's names with the same shapes: a mismatch is refused (ValueError naming
    the model and the tensor), never broadcast or averaged over what happens to be there."""
    if len(models) == 0:
        raise ValueError("weighted_average needs at least one model")
    if len(weights) != len(models):
        raise ValueError(f"weighted_average: {len(models)} models but {len(weights)} weights")
    for k, m in enumerate(models[1:], 1):
        bad = mismatch(models[0], m)
        if bad:
            raise ValueError(f"weighted_average: model {k} does not match model 0: {bad}")
    w = torch.as_tensor([float(x) for x in weights], dtype=torch.float64)
    if torch.any(w < 0) or float(w.sum()) <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {list(weights)}")
    w = w / w.sum()
    out: Params = {}
    for name in models[0]:
        stacked = torch.stack([m[name].detach().to(torch.float64) for m in models])
        shape = (-1,) + (1,) * (stacked.dim() - 1)
        out[name] = (stacked * w.to(stacked.device).view(shape)).sum(0).to(models[0][name].dtype)
    return out


def mismatch(ref: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor]) -> str:
    """How ``other``'s names or shapes differ from ``ref``'s ("" where they do not), e.g.
    ``"'fc.bias' has shape [1], not [10]"``."""
    if other.keys() != ref.keys():
        missing, extra = sorted(set(ref) - set(other)), sorted(set(other) - set(ref))
        return "; ".join(p for p in (f"missing {missing}" if missing else "", f"extra {extra}" if extra else "") if p)
    for name, t in other.items():
        if t.shape != ref[name].shape:
            return f"{name!r} has shape {list(t.shape)}, not {list(ref[name].shape)}"
    return ""


def num_bytes(params: Mapping[str, torch.Tensor]) -> int:
    """Bytes needed to send these tensors (their element count times element size)."""
    return int(sum(t.numel() * t.element_size() for t in params.values()))


def num_params(params: Mapping[str, torch.Tensor]) -> int:
    """The number of scalars in all tensors."""
    return int(sum(t.numel() for t in params.values()))


def equal(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``a`` and ``b`` have the same names and equal tensors."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def sub(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> Params:
    """``a - b`` per tensor, over ``a``'s names."""
    return {k: a[k] - b[k] for k in a}


def flatten(params: Mapping[str, torch.Tensor], dtype: torch.dtype | None = None) -> torch.Tensor:
    """Every tensor as one vector, in the dictionary's order (converted to ``dtype`` when given)."""
    return torch.cat([t.reshape(-1) if dtype is None else t.reshape(-1).to(dtype) for t in params.values()])


def unflatten(flat: torch.Tensor, like: Mapping[str, torch.Tensor]) -> Params:
    """The vector ``flat`` cut into tensors shaped (and typed) as ``like``'s, in its order (views where the dtype
    matches: clone to own the storage)."""
    parts = torch.split(flat, [t.numel() for t in like.values()])
    return {n: p.view_as(t).to(t.dtype) for (n, t), p in zip(like.items(), parts)}


def stack_copies(params: Mapping[str, torch.Tensor], m: int) -> Params:
    """``{name: (m, *shape)}``: ``m`` copies of every tensor (a server's per-client store, e.g. the initial model
    for every client)."""
    return {k: v.detach().unsqueeze(0).repeat((m,) + (1,) * v.dim()) for k, v in params.items()}


def with_rows(stacked: Mapping[str, torch.Tensor], rows: Mapping[int, Mapping[str, torch.Tensor]]) -> Params:
    """A copy of a per-client store with row ``i`` of every tensor replaced by ``rows[i]`` (new tensors)."""
    out = {k: v.clone() for k, v in stacked.items()}
    for i, params in rows.items():
        for k, v in params.items():
            out[k][i] = v.detach()
    return out
