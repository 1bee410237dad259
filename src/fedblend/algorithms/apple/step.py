"""APPLE's mini-batch step (Eq. 2-5): the mixture of every client's core by the DR vector, and the gradient step
on the own core and the DR vector through it (plain, or with the APPLE authors' momentum). Part of
:mod:`fedblend.algorithms.apple`."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.parts.rows import aggregate_row, row_dots, weighted_sum
from fedblend.common.params import Params


def mixture(dr: torch.Tensor, cores: Mapping[str, torch.Tensor]) -> Params:
    """Eq. 2: ``w = sum_j p_j c_j`` (``cores[name]`` stacked over clients)."""
    return aggregate_row(dr, cores)



class _MixtureWithOwnRow(torch.autograd.Function):
    """``sum_j p_j c_j`` (float64, as :func:`mixture`) where row ``cid`` of the stacked cores is the client's own
    core: the other rows are a float64 buffer kept for the whole local training (only row ``cid`` is rewritten
    each step), instead of re-stacking and converting every client's core for every batch. Forward and backward
    compute what autograd through ``cat`` / ``to`` / ``mul`` / ``sum`` does, bit for bit (tested), slice by slice
    (:func:`~fedblend.algorithms.parts.rows.weighted_sum`, :func:`~fedblend.algorithms.parts.rows.row_dots`); the
    gradient of the full stacked tensor is never formed, only its row ``cid``."""

    @staticmethod
    def forward(ctx, p: torch.Tensor, own: torch.Tensor, buffer64: torch.Tensor, cid: int,
                p_scale: float | None = None) -> torch.Tensor:
        buffer64[cid].copy_(own.detach())
        p64 = p.detach().to(torch.float64)
        ctx.save_for_backward(p64)
        ctx.buffer64, ctx.cid, ctx.p_dtype, ctx.own_dtype, ctx.p_scale = buffer64, cid, p.dtype, own.dtype, p_scale
        return weighted_sum(p64, buffer64, own.dtype)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (p64,) = ctx.saved_tensors
        g = grad_out.to(torch.float64)
        grad_p = row_dots(g, ctx.buffer64)
        if ctx.p_scale is not None:  # dr_grad = "mean": this tensor's share of PFLlib's mean of element-wise means
            grad_p = grad_p * ctx.p_scale
        grad_own = (g * p64[ctx.cid]).to(ctx.own_dtype)
        return grad_p.to(ctx.p_dtype), grad_own, None, None, None


def stacked64(cores: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The received cores in float64, the buffer :func:`apple_step` mixes from (row ``cid`` is overwritten)."""
    return {k: v.detach().to(torch.float64) for k, v in cores.items()}


def apple_step(model, own: Params, cid: int, cores: Mapping[str, torch.Tensor], dr: torch.Tensor,
               prior: torch.Tensor, x: torch.Tensor, y: torch.Tensor, core_lr: float, dr_lr: float,
               lam_mu: float, buffer64: dict[str, torch.Tensor] | None = None,
               dr_grad: str = "exact", momentum: float = 0.0,
               velocity: dict[str, torch.Tensor] | None = None) -> tuple[Params, torch.Tensor, float]:
    """One APPLE mini-batch step (Eq. 3-5): gradients of the cross-entropy of the mixture w.r.t. the own core and
    the DR vector, plus ``lam_mu (p - p0)`` on the DR vector. Returns the new core, DR vector and batch loss.
    ``buffer64`` (:func:`stacked64` of ``cores``, reused across the steps of a local training) saves re-stacking
    the cores per batch; without it one is built. ``dr_grad = "mean"`` replaces Eq. 5's inner product over all
    parameters by PFLlib's mean over the ``T`` tensors of each tensor's element-wise mean (each tensor's sum
    divided by ``numel * T``). ``momentum`` > 0: both steps are ``torch.optim.SGD``'s with that momentum, their
    buffers kept in ``velocity`` (a dict the caller makes anew each local training; the APPLE authors' optimiser,
    one SGD with momentum 0.9 over the cores and the DR vector made each round)."""
    buffer64 = stacked64(cores) if buffer64 is None else buffer64
    own_t = {k: v.detach().clone().requires_grad_(True) for k, v in own.items()}
    p = dr.detach().clone().requires_grad_(True)
    scale = {k: 1.0 / (v.numel() * len(own_t)) if dr_grad == "mean" else None for k, v in own_t.items()}
    w = {k: _MixtureWithOwnRow.apply(p, own_t[k], buffer64[k], cid, scale[k]) for k in own_t}
    loss = F.cross_entropy(functional_call(model, w, (x,)), y)
    grads = torch.autograd.grad(loss, list(own_t.values()) + [p])
    steps = [*grads[:-1], grads[-1] + lam_mu * (p - prior.to(p.dtype))]
    if momentum:
        steps = [_momentum(velocity, k, g, momentum) for k, g in zip([*own_t, "\0dr"], steps)]
    new_own = {k: (v - core_lr * g).detach() for (k, v), g in zip(own_t.items(), steps[:-1])}
    return new_own, (p - dr_lr * steps[-1]).detach(), float(loss.detach())


def _momentum(velocity: dict[str, torch.Tensor] | None, key: str, grad: torch.Tensor, momentum: float) -> torch.Tensor:
    """``torch.optim.SGD``'s momentum buffer in ``velocity[key]`` (no dampening): the first gradient, then
    ``momentum * buffer + gradient``; the step direction."""
    buf = velocity.get(key)
    velocity[key] = grad.detach().clone() if buf is None else buf.mul_(momentum).add_(grad.detach())
    return velocity[key]
