"""A model's *stacked twin*: the same model run for ``k`` clients at once on their merged batches, each client with
its own parameters, without ``vmap``.

The twin is a copy of the model whose ``nn.Linear`` and ``nn.Conv2d`` layers take parameters stacked over a leading
client axis (``[k, out, in]``): a linear layer becomes one batched matrix product (``baddbmm``) over the clients'
rows, a convolution one grouped convolution (client ``c``'s channels are group ``c``). Every other layer of the
model's own forward code (activations, pooling, ``flatten(1)``) already treats samples independently, so it runs
unchanged on the merged batch of ``k * b`` samples. Handed the stacked parameter dictionary (its layers read it from
a shared ``feed``: no module attributes are swapped per step), it gives every client's logits in a few kernels per
layer, where ``vmap`` adds per-operator batching
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


class _Stacked(nn.Module):
    """A layer of the twin: it holds no parameters, it reads its stacked ones from the twin's ``feed`` (a dict
    the whole twin shares, filled by :func:`twin_logits`), so a step hands the twin its parameters without
    swapping module attributes."""

    def __init__(self, layer: nn.Module, name: str, feed: dict):
        super().__init__()
        self.key, self.feed, self.has_bias = name + ".", feed, layer.bias is not None

    def params(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.feed[self.key + "weight"], self.feed[self.key + "bias"] if self.has_bias else None

    @property
    def weight(self) -> torch.Tensor:  # for forward code that reads a layer's weight (its dtype, its device)
        return self.feed[self.key + "weight"]


class StackedLinear(_Stacked):
    """``nn.Linear`` for ``k`` clients: input ``[k * b, ..., in]`` (client-major), weight ``[k, out, in]`` or,
    in the twin's own layout (``feed["native"]``), ``[k, in, out]`` (whose gradient is contiguous)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, bias = self.params()
        k = w.shape[0]
        rows = x.reshape(k, -1, x.shape[-1])
        w = w if self.feed["native"] else w.transpose(1, 2)
        out = torch.bmm(rows, w) if bias is None else torch.baddbmm(bias.unsqueeze(1), rows, w)
        return out.reshape(*x.shape[:-1], out.shape[-1])


class StackedConv2d(_Stacked):
    """``nn.Conv2d`` for ``k`` clients as one grouped convolution: input ``[k * b, C, H, W]`` (client-major)."""

    def __init__(self, layer: nn.Conv2d, name: str, feed: dict):
        super().__init__(layer, name, feed)
        self.stride, self.padding, self.dilation, self.groups = layer.stride, layer.padding, layer.dilation, layer.groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, bias = self.params()
        k = w.shape[0]
        b = x.shape[0] // k
        merged = x.reshape(k, b, *x.shape[1:]).transpose(0, 1).reshape(b, k * x.shape[1], *x.shape[2:])
        out = F.conv2d(merged, w.flatten(0, 1), None if bias is None else bias.flatten(), self.stride, self.padding,
                       self.dilation, self.groups * k)
        return out.reshape(b, k, -1, *out.shape[2:]).transpose(0, 1).reshape(k * b, -1, *out.shape[2:])


TWINS = {nn.Linear: StackedLinear, nn.Conv2d: StackedConv2d}


def stacked_twin(model: nn.Module) -> nn.Module | None:
    """The model's stacked twin (module docstring), or None where a layer has no stacked form. Its ``native``
    attribute names the parameters it takes in its own layout under ``native=True`` (linear weights transposed,
    :func:`to_native`)."""
    for m in model.modules():
        if list(m.buffers(recurse=False)):
            return None
        if list(m.parameters(recurse=False)) and (type(m) not in TWINS or getattr(m, "padding_mode", "zeros") != "zeros"):
            return None
    twin, feed = copy.deepcopy(model), {"native": False}
    twin.feed, twin.native = feed, set()
    for name, m in list(twin.named_modules()):
        if type(m) in TWINS:
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, attr, TWINS[type(m)](m, name, feed))
            if type(m) is nn.Linear:
                twin.native.add(name + ".weight")
    return twin


def to_native(twin: nn.Module, stacked: dict) -> dict:
    """Stacked parameters (``[k, ...]``, the model's layout) in the twin's own layout, contiguous; and back with
    ``back=True`` (:func:`from_native`): linear weights ``[k, out, in] <-> [k, in, out]``."""
    return {n: (v.transpose(1, 2).contiguous() if n in twin.native else v) for n, v in stacked.items()}


from_native = to_native  # the transpose is its own inverse


def twin_logits(twin: nn.Module, params: dict, x: torch.Tensor, native: bool = False) -> torch.Tensor:
    """Logits ``[k, b, classes]`` of ``k`` clients (``params`` stacked ``[k, ...]``; in the twin's layout with
    ``native``) on their batches ``x`` (``[k, b, ...]``)."""
    k, b = x.shape[:2]
    twin.feed.update(params)
    twin.feed["native"] = native
    return twin(x.flatten(0, 1)).view(k, b, -1)


def vmap_logits(model: nn.Module):
    """The same as :func:`twin_logits` through ``vmap`` of the model itself (any model)."""
    return vmap(lambda p, x: functional_call(model, p, (x,)))


def twin_agrees(model: nn.Module, twin: nn.Module, params: dict, x: torch.Tensor) -> bool:
    """Whether the twin gives ``vmap``'s logits on one stacked batch (within float reassociation); False also
    where the model's forward cannot run on the twin at all."""
    with torch.no_grad():
        b = vmap_logits(model)(params, x)
        try:
            a = twin_logits(twin, params, x)
        except Exception:  # noqa: BLE001 - a forward the twin cannot run (it reads a layer's attributes) keeps vmap
            return False
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
