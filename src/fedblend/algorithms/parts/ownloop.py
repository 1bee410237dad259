"""Shared parts of methods whose client update is an optimisation loop of its own (Per-FedAvg's meta-steps,
pFedMe's Moreau-envelope inner solver): functional losses and gradients over a parameter dictionary, an endless
batch stream from a client's random stream, and :class:`OwnLoopMethod`, whose ``local_training`` hook is such a
loop.

A loop here is plain code on the client (``Traits.own_loop``): a batching backend runs such
clients one by one. Everything else (client init, transforms such as ALA, before / after scores, keeping the
model, the reply) is the :class:`~fedblend.core.method.Method` template's, so ``+ala`` composes as with FedAvg.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, Method, State, Traits
from fedblend.core.training import TrainResult, batches, batches_per_epoch, forward

LossFn = Callable[[Mapping[str, torch.Tensor]], torch.Tensor]


def batch_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> LossFn:
    """``params -> cross-entropy of the model with params on (x, y)`` (differentiable in the params)."""
    return lambda params: F.cross_entropy(forward(model, params, x)[0], y)


def grad(loss: LossFn, params: Mapping[str, torch.Tensor], names: Sequence[str] | None = None) -> Params:
    """``nabla loss(params)`` w.r.t. the tensors ``names`` (all when None), as detached tensors."""
    names = list(params) if names is None else list(names)
    work = {k: v.detach().requires_grad_(k in names) for k, v in params.items()}
    grads = torch.autograd.grad(loss(work), [work[n] for n in names])
    return {n: g.detach() for n, g in zip(names, grads)}


def batch_stream(n: int, batch_size: int, generator: torch.Generator,
                 drop_last: bool = False, shuffle: bool = True) -> Iterator[torch.Tensor]:
    """Index batches without end: a fresh permutation per epoch, last partial batch kept unless ``drop_last`` (as
    local SGD draws; with ``drop_last`` and fewer than ``batch_size`` samples there is no batch: the caller must
    check :func:`steps_per_epochs` first)."""
    while True:
        yield from batches(n, batch_size, 1, generator, drop_last, shuffle)


def steps_per_epochs(n: int, batch_size: int, epochs: int, drop_last: bool = False) -> int:
    """Mini-batches in ``epochs`` passes over ``n`` samples."""
    return epochs * batches_per_epoch(n, batch_size, drop_last) if n else 0


class OwnLoopMethod(Method):
    """The template whose ``local_training`` is :meth:`local_update`, a loop of the method's own (no TrainSpec)."""

    def declare(self, choice: str) -> Traits:
        return replace(super().declare(choice), own_loop=True)

    def local_update(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx
                     ) -> tuple[Params, State, float]:
        """The client's update from ``params``: (new shared model, new state, mean training loss)."""
        raise NotImplementedError

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        yield from ()  # a generator that yields no TrainSpec: the whole update is the method's own loop
        params, cstate, loss = self.local_update(params, msg, cstate, ctx)
        ctx.stats["train_loss"] = loss
        return TrainResult(params, None, loss, 0, 0), cstate
