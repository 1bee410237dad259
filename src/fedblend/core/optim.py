"""Optimizers as data: ``init(params) -> state`` and ``step(params, grads, state, ...) -> (params, state)`` over
parameter dictionaries, the state plain tensors and numbers (optax's init/update split), so an optimizer's
buffers live in a client's or the server's state and go through checkpoints and the process backend as data.

One SGD rule serves every learner that steps a parameter dict functionally: server-side hypernetworks (pFedHN,
pFedLA), FedGH's global header, and the ``vmap`` backend's batched client SGD (:func:`sgd_direction`, with a
per-client "fresh buffer" mask). Adam serves pFedRLLA's agent and embedding network.

The sequential client training loop (:func:`fedblend.core.training.sgd_train`) applies the same rule in place
with ``torch``'s fused ``add(..., alpha=)`` / ``sub_(..., alpha=)`` kernels. Those round differently from the
unfused ``p - lr * g`` here (an FMA: measured, 37k of 300k elements differ in the last bit), and every recorded
result depends on that loop, so it keeps its fused form: merging the two would move results.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

Params = dict[str, torch.Tensor]


def sgd_direction(g: torch.Tensor, p: torch.Tensor, buf: torch.Tensor | None, momentum: float,
                  weight_decay: float, fresh: bool | torch.Tensor) -> torch.Tensor:
    """``torch.optim.SGD``'s step direction: ``g + wd * p``, then heavy-ball ``b = mu * b + g`` (``b = g`` where
    the buffer is ``fresh``: a bool, or a bool tensor broadcast against ``g`` for a stack of learners). The
    direction is also the new momentum buffer."""
    if weight_decay:
        g = g + weight_decay * p
    if not momentum:
        return g
    if isinstance(fresh, torch.Tensor):
        return torch.where(fresh, g, momentum * buf + g)
    return g if fresh else momentum * buf + g


def sgd_init(net: Mapping[str, torch.Tensor]) -> dict:
    return {"buf": {k: torch.zeros_like(v) for k, v in net.items()}, "t": 0}


def sgd_step(net: Mapping[str, torch.Tensor], grads: Mapping[str, torch.Tensor], opt: Mapping, lr: float,
             momentum: float = 0.0, weight_decay: float = 0.0, lrs: Mapping[str, float] | None = None,
             decay: Mapping[str, bool] | None = None) -> tuple[Params, dict]:
    """One step of SGD with heavy-ball momentum (``torch.optim.SGD``'s update, :func:`sgd_direction`;
    ``p = p - lr * b``); returns new tensors. ``lrs`` / ``decay`` override the learning rate / switch weight decay
    off per tensor (``torch.optim`` parameter groups)."""
    first = int(opt["t"]) == 0
    new, bufs = {}, {}
    for k in net:
        wd = weight_decay if decay is None or decay.get(k, True) else 0.0
        g = sgd_direction(grads[k], net[k], opt["buf"][k], momentum, wd, first)
        bufs[k] = g.detach() if momentum else opt["buf"][k]
        new[k] = (net[k] - (lrs or {}).get(k, lr) * g).detach()
    return new, {"buf": bufs, "t": int(opt["t"]) + 1}


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


def clip_grad_norm(grads: Mapping[str, torch.Tensor], max_norm: float) -> Params:
    """``torch.nn.utils.clip_grad_norm_``: scale all gradients by ``max_norm / (total 2-norm + 1e-6)`` if below 1."""
    total = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    scale = min(1.0, float(max_norm / (total + 1e-6)))
    return {k: g * scale for k, g in grads.items()}


def minimise(net: Mapping[str, torch.Tensor], opt: Mapping, lr: float,
             loss_fn: Callable[[Params], torch.Tensor]) -> tuple[Params, dict, float]:
    """One Adam step on ``loss_fn(net)``; returns the new net, the new optimizer state and the loss."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in net.items()}
    loss = loss_fn(leaves)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    new, opt = adam_step(net, dict(zip(leaves, grads)), opt, lr)
    return new, opt, float(loss.detach())
