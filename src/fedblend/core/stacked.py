"""A model's *stacked twin*: the same model run for ``k`` clients at once on their merged batches, each client with
its own parameters, without ``vmap``.

The twin is a copy of the model whose ``nn.Linear`` and ``nn.Conv2d`` layers take parameters stacked over a leading
client axis (``[k, out, in]``): a linear layer becomes one batched matrix product (``baddbmm``) over the clients'
rows, a convolution one grouped convolution (client ``c``'s channels are group ``c``). Every other layer of the
model's own forward code (activations, pooling, ``flatten(1)``) already treats samples independently, so it runs
unchanged on the merged batch of ``k * b`` samples. Called through ``functional_call`` with the stacked parameter
dictionary, it gives every client's logits in a few kernels per layer, where ``vmap`` adds per-operator batching
overhead to the forward and the backward pass (measured: about 1.6x the time of the same step on the overhead-bound
CPU proxy, see docs/benchmarks.md).

A model the twin cannot express -- a layer with parameters other than these two, a layer with buffers (batch
norm), a convolution with non-zero padding modes -- has no twin (:func:`stacked_twin` returns None), and the
``vmap`` backend uses ``vmap``. A forward that mixes samples without a module (a functional batch norm) would be
wrong on a merged batch, so the backend checks the twin against ``vmap`` on the first batch it trains
(:func:`twin_agrees`) and keeps ``vmap`` for a model where they differ.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap


class StackedLinear(nn.Module):
    """``nn.Linear`` for ``k`` clients: input ``[k * b, ..., in]`` (client-major), weight ``[k, out, in]``."""

    def __init__(self, layer: nn.Linear):
        super().__init__()
        self.weight = nn.Parameter(layer.weight.detach()[None].clone())
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach()[None].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight.shape[0]
        rows = x.reshape(k, -1, x.shape[-1])
        w = self.weight.transpose(1, 2)
        out = torch.bmm(rows, w) if self.bias is None else torch.baddbmm(self.bias.unsqueeze(1), rows, w)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class StackedConv2d(nn.Module):
    """``nn.Conv2d`` for ``k`` clients as one grouped convolution: input ``[k * b, C, H, W]`` (client-major)."""

    def __init__(self, layer: nn.Conv2d):
        super().__init__()
        self.weight = nn.Parameter(layer.weight.detach()[None].clone())
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach()[None].clone())
        self.stride, self.padding, self.dilation, self.groups = layer.stride, layer.padding, layer.dilation, layer.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        k = self.weight.shape[0]
        b = x.shape[0] // k
        merged = x.reshape(k, b, *x.shape[1:]).transpose(0, 1).reshape(b, k * x.shape[1], *x.shape[2:])
        bias = None if self.bias is None else self.bias.flatten()
        out = F.conv2d(merged, self.weight.flatten(0, 1), bias, self.stride, self.padding, self.dilation,
                       self.groups * k)
        return out.reshape(b, k, -1, *out.shape[2:]).transpose(0, 1).reshape(k * b, -1, *out.shape[2:])


TWINS = {nn.Linear: StackedLinear, nn.Conv2d: StackedConv2d}


def stacked_twin(model: nn.Module) -> nn.Module | None:
    """The model's stacked twin (module docstring), or None where a layer has no stacked form."""
    for m in model.modules():
        if list(m.buffers(recurse=False)):
            return None
        if list(m.parameters(recurse=False)) and (type(m) not in TWINS or getattr(m, "padding_mode", "zeros") != "zeros"):
            return None
    twin = copy.deepcopy(model)
    for name, m in list(twin.named_modules()):
        if type(m) in TWINS:
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, attr, TWINS[type(m)](m))
    return twin


def twin_logits(twin: nn.Module, params: dict, x: torch.Tensor) -> torch.Tensor:
    """Logits ``[k, b, classes]`` of ``k`` clients (``params`` stacked ``[k, ...]``) on their batches ``x``
    (``[k, b, ...]``)."""
    k, b = x.shape[:2]
    return functional_call(twin, params, (x.flatten(0, 1),), tie_weights=False).view(k, b, -1)


def vmap_logits(model: nn.Module):
    """The same as :func:`twin_logits` through ``vmap`` of the model itself (any model)."""
    return vmap(lambda p, x: functional_call(model, p, (x,)))


def twin_agrees(model: nn.Module, twin: nn.Module, params: dict, x: torch.Tensor) -> bool:
    """Whether the twin gives ``vmap``'s logits on one stacked batch (within float reassociation)."""
    with torch.no_grad():
        a = twin_logits(twin, params, x)
        b = vmap_logits(model)(params, x)
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


#: padded evaluation data of at most this many bytes is scored at once (a group of clients, at least one)
EVAL_BYTES = 256 * 2**20


@torch.no_grad()
def evaluate_stacked(logits, items: list[tuple[dict, torch.Tensor, torch.Tensor]],
                     batch_size: int) -> list[tuple[int, float, int]]:
    """``(correct, summed loss, n)`` of several clients' *own* models (``items``: params, x, y; same parameter
    names and shapes), stacked: every chunk of ``batch_size`` samples of every client in one call of ``logits``
    (:func:`twin_logits` or :func:`vmap_logits`). Clients are taken longest first, in groups whose padded data
    fits :data:`EVAL_BYTES`; at each chunk only the clients that still have samples are scored."""
    order = sorted(range(len(items)), key=lambda i: -len(items[i][2]))
    out: list[tuple[int, float, int] | None] = [None] * len(items)
    start = 0
    while start < len(order):
        size = max(1, len(items[order[start]][2]))
        per_client = size * max(1, items[order[start]][1][:1].nbytes)
        group = order[start : start + max(1, EVAL_BYTES // per_client)]
        start += len(group)
        params = {n: torch.stack([items[i][0][n] for i in group]) for n in items[group[0]][0]}
        ns = [len(items[i][2]) for i in group]
        x0 = items[group[0]][1]
        X = x0.new_zeros((len(group), size, *x0.shape[1:]))
        Y = torch.zeros((len(group), size), dtype=torch.long, device=x0.device)
        for j, i in enumerate(group):
            X[j, : ns[j]], Y[j, : ns[j]] = items[i][1], items[i][2]
        real = torch.arange(size, device=x0.device)[None, :] < torch.tensor(ns, device=x0.device)[:, None]
        correct = torch.zeros(len(group), dtype=torch.long, device=x0.device)
        loss = torch.zeros(len(group), dtype=torch.float64, device=x0.device)
        for lo in range(0, size, batch_size):
            k = sum(1 for n in ns if n > lo)
            if not k:  # a group of clients without samples
                break
            p = {n: v[:k] for n, v in params.items()}
            o = logits(p, X[:k, lo : lo + batch_size])
            yb, m = Y[:k, lo : lo + batch_size], real[:k, lo : lo + batch_size]
            per = F.cross_entropy(o.flatten(0, 1), yb.flatten(), reduction="none").view(k, -1).double()
            loss[:k] += torch.where(m, per, 0.0).sum(1)
            correct[:k] += ((o.argmax(-1) == yb) & m).sum(1)
        for j, i in enumerate(group):
            out[i] = (int(correct[j]), float(loss[j]), ns[j])
    return out  # type: ignore[return-value]
