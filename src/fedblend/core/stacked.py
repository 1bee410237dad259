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
