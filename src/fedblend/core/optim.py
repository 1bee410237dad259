"""Optimizers as data: hyperparameters bound at construction, ``init(params) -> state`` and an update that
returns (or writes) the new parameters and state, the state plain tensors and numbers (optax's shape), so an
optimizer's buffers live in a client's or the server's state and go through checkpoints and the process backend
as data.

:class:`SGD` is the client optimizer: every client-training driver calls it, the sequential loop
(:func:`fedblend.core.training.sgd_train`) on one client's tensors and the ``vmap`` backend on tensors stacked
over a client axis (the update is element-wise, so a stack of clients is updated exactly as each client alone).
It updates in place with ``torch._foreach_*`` kernels (one call for all tensors; on a GPU one fused launch), and
its arithmetic is the fused ``add(..., alpha=)`` of ``torch.optim.SGD``'s update -- the bits of every recorded
result.

The functional :func:`sgd_step` / :func:`adam_step` serve the server-side learners that step a parameter dict
and keep the old one (pFedHN's and pFedLA's hypernetworks, FedGH's header, pFedRLLA's agent): their unfused
``p - lr * g`` rounds differently from the fused update (an FMA: measured, 37k of 300k elements differ in the
last bit), and their recorded results depend on it, so they keep it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

Params = dict[str, torch.Tensor]


@dataclass(frozen=True)
class SGD:
    """``torch.optim.SGD``'s update (Robbins & Monro; heavy-ball momentum), in place over lists of tensors:
    ``g = grad + wd * p``; ``b = mu * b + g``; ``p = p - lr * b``.

    A fresh momentum buffer is a zero tensor: ``mu * 0 + g`` is ``g`` exactly, torch's ``b = g`` on the first
    step, so a client with a kept buffer and one without update together in one stack."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0

    def init(self, params: Sequence[torch.Tensor],
             kept: Sequence[torch.Tensor | None] | None = None) -> list[torch.Tensor]:
        """Momentum buffers (none without momentum): ``kept[i]`` copied where given, zeros elsewhere."""
        if not self.momentum:
            return []
        kept = kept or [None] * len(params)
        return [torch.zeros_like(p) if k is None else k.detach().clone().to(p) for p, k in zip(params, kept)]

    @torch.no_grad()
    def update_(self, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                bufs: Sequence[torch.Tensor]) -> None:
        """One step, written into ``params`` and ``bufs``."""
        params, grads = list(params), list(grads)
        if self.weight_decay:
            grads = torch._foreach_add(grads, params, alpha=self.weight_decay)
        if self.momentum:
            torch._foreach_mul_(bufs, self.momentum)
            torch._foreach_add_(bufs, grads)
            grads = bufs
        torch._foreach_add_(params, grads, alpha=-self.lr)


def sgd_direction(g: torch.Tensor, p: torch.Tensor, buf: torch.Tensor | None, momentum: float,
                  weight_decay: float, fresh: bool) -> torch.Tensor:
    """``torch.optim.SGD``'s step direction: ``g + wd * p``, then heavy-ball ``b = mu * b + g`` (``b = g`` on a
    ``fresh`` buffer). The direction is also the new momentum buffer."""
    if weight_decay:
        g = g + weight_decay * p
    if not momentum:
        return g
    return g if fresh else momentum * buf + g


def sgd_init(net: Mapping[str, torch.Tensor]) -> dict:
    return {"buf": {k: torch.zeros_like(v) for k, v in net.items()}, "t": 0}


#: elements per slice of :func:`sgd_step` and :func:`global_norm` on a CPU tensor: a slice of each input,
#: output and temporary stays in cache, and no temporary the size of the tensor is allocated (on a CPU, a fresh
#: allocation of a large tensor costs a page fault per 4 KiB page: for pFedHN's 58M-entry hypernetwork the
#: temporaries of an unsliced step took longer than its arithmetic)
SLICE = 1 << 15


def sgd_step(net: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], opt: Mapping, lr: float,
             momentum: float = 0.0, weight_decay: float = 0.0, lrs: Mapping[str, float] | None = None,
             decay: Mapping[str, bool] | None = None, donate: bool = False) -> tuple[Params, dict]:
    """One step of SGD with heavy-ball momentum (``torch.optim.SGD``'s update, :func:`sgd_direction`;
    ``p = p - lr * b``); returns new tensors and leaves ``net`` and ``opt`` as they were. ``lrs`` / ``decay``
    override the learning rate / switch weight decay off per tensor (``torch.optim`` parameter groups).

    Every product is rounded before its sum, as in :func:`sgd_direction` (``g + fl(wd * p)``,
    ``fl(mu * b) + d``, ``p - fl(lr * b)``): the rounding the recorded results hold. On a CPU the update runs slice
    by slice (:data:`SLICE`) into the two new tensors, so its only allocations are the new parameters and the new
    momentum buffer; ``donate = True`` lets the new parameters take the memory of ``grads`` (which the caller gives
    up: they hold the new parameters afterwards)."""
    first = int(opt["t"]) == 0
    new, bufs = {}, {}
    for k, p in net.items():
        wd = weight_decay if decay is None or decay.get(k, True) else 0.0
        g = grads[k]
        own = donate and g.is_contiguous() and g.shape == p.shape and g.dtype == p.dtype and g.device == p.device
        out = g if own else torch.empty(p.shape, dtype=p.dtype, device=p.device)
        buf = torch.empty(p.shape, dtype=p.dtype, device=p.device) if momentum else None
        _sgd_update(p.reshape(-1), g.reshape(-1), None if first or not momentum else opt["buf"][k].reshape(-1),
                    out.view(-1), None if buf is None else buf.view(-1), (lrs or {}).get(k, lr), momentum, wd)
        new[k] = out
        bufs[k] = buf if momentum else opt["buf"][k]
    return new, {"buf": bufs, "t": int(opt["t"]) + 1}


@torch.no_grad()
def _sgd_update(p: torch.Tensor, g: torch.Tensor, buf: torch.Tensor | None, out: torch.Tensor,
                new_buf: torch.Tensor | None, lr: float, momentum: float, wd: float) -> None:
    """:func:`sgd_step` on flat tensors: ``d = g + fl(wd * p)``; ``new_buf = fl(mu * buf) + d`` (``d`` on a fresh
    buffer, ``buf = None``); ``out = p - fl(lr * new_buf)`` (``lr * d`` without momentum). ``out`` may be ``g``'s
    memory: each slice of ``g`` is read before that slice of ``out`` is written."""
    step = max(1, p.numel()) if p.device.type != "cpu" else SLICE
    tmp = torch.empty(min(step, p.numel()), dtype=p.dtype, device=p.device)
    for s in range(0, p.numel(), step):
        e = min(s + step, p.numel())
        t = tmp[:e - s]
        if wd:
            torch.mul(p[s:e], wd, out=t)
            torch.add(g[s:e], t, out=t)
        else:
            t.copy_(g[s:e])
        if new_buf is not None:
            b = new_buf[s:e]
            if buf is None:
                b.copy_(t)
            else:
                torch.mul(buf[s:e], momentum, out=b)
                b.add_(t)
            torch.mul(b, lr, out=t)
        else:
            t.mul_(lr)
        torch.sub(p[s:e], t, out=out[s:e])


def adam_init(net: Mapping[str, torch.Tensor]) -> dict:
    return {"m": {k: torch.zeros_like(v) for k, v in net.items()},
            "v": {k: torch.zeros_like(v) for k, v in net.items()}, "t": 0}


def adam_step(net: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], opt: Mapping, lr: float,
              betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> tuple[Params, dict]:
    """One step of Adam (Kingma & Ba 2015; ``torch.optim.Adam``'s update); returns new tensors."""
    b1, b2 = betas
    t = int(opt["t"]) + 1
    m = {k: b1 * opt["m"][k] + (1 - b1) * grads[k] for k in net}
    v = {k: b2 * opt["v"][k] + (1 - b2) * grads[k] * grads[k] for k in net}
    c1, c2 = 1 - b1 ** t, 1 - b2 ** t
    new = {k: (net[k] - lr * (m[k] / c1) / ((v[k] / c2).sqrt() + eps)).detach() for k in net}
    return new, {"m": m, "v": v, "t": t}


def global_norm(tensors: Sequence[torch.Tensor]) -> float:
    """The 2-norm of all ``tensors`` together, accumulated in float64 slice by slice (:data:`SLICE` on a CPU): exact
    to double precision without a float64 copy of a whole tensor. (torch's float32 ``vector_norm`` is off by
    ~0.4 % at 50M entries: measured on pFedHN's hypernetwork gradient.)"""
    total = 0.0
    for t in tensors:
        flat = t.detach().reshape(-1)
        step = max(1, flat.numel()) if flat.device.type != "cpu" else SLICE
        for s in range(0, flat.numel(), step):
            total += float(flat[s:s + step].double().square().sum())
    return math.sqrt(total)


def clip_grad_norm(grads: Mapping[str, torch.Tensor], max_norm: float) -> tuple[Params, float]:
    """``torch.nn.utils.clip_grad_norm_``'s rule (the authors' pFedHN code calls it): scale all gradients by
    ``max_norm / (norm + 1e-6)`` where that is below 1, the norm of all of them together (:func:`global_norm`);
    returns the gradients (the same tensors where nothing is scaled) and their 2-norm after the clip."""
    total = global_norm(list(grads.values()))
    scale = min(1.0, float(max_norm / (total + 1e-6)))
    if scale == 1.0:
        return dict(grads), total
    return {k: g * scale for k, g in grads.items()}, total * scale


def minimise(net: Mapping[str, torch.Tensor], opt: Mapping, lr: float,
             loss_fn: Callable[[Params], torch.Tensor]) -> tuple[Params, dict, float]:
    """One Adam step on ``loss_fn(net)``; returns the new net, the new optimizer state and the loss."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in net.items()}
    loss = loss_fn(leaves)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    new, opt = adam_step(net, dict(zip(leaves, grads)), opt, lr)
    return new, opt, float(loss.detach())
