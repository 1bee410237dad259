"""Local training written functionally, so client execution can later be batched (``torch.func``).

:func:`sgd_train` runs mini-batch SGD (PyTorch's ``SGD`` update rule, with optional momentum whose buffers
are returned so a method can keep them in the client-state store) over a parameter dictionary with
``torch.func.functional_call``. Batches come from a passed-in generator (one random permutation per epoch,
last partial batch kept, like ``DataLoader(shuffle=True)``). An optional ``extra_loss(params)`` adds a
regulariser (FedProx's proximal term, Ditto, FedAMP); ``trainable`` restricts which tensors move (FedRep).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedblend.common.params import Params


@dataclass(frozen=True)
class TrainConfig:
    """Client optimiser settings (the ``[train]`` table of a run config)."""

    CHOICES: ClassVar[dict] = {"optimizer_state": ("reset", "keep")}

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 64
    epochs: int = 1
    optimizer_state: str = "reset"  # "keep": momentum buffers persist across rounds in the client state


@dataclass
class TrainResult:
    params: Params
    momentum: Params | None
    mean_loss: float
    steps: int
    samples: int


def batches(n: int, batch_size: int, epochs: int, generator: torch.Generator) -> Iterable[torch.Tensor]:
    """Index batches: a fresh random permutation per epoch, last partial batch kept."""
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        yield from torch.split(perm, batch_size)


def sgd_train(model: nn.Module, params: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
              cfg: TrainConfig, generator: torch.Generator, *, momentum: Mapping[str, torch.Tensor] | None = None,
              extra_loss: Callable[[Params], torch.Tensor] | None = None,
              trainable: Iterable[str] | None = None, epochs: int | None = None,
              lr: float | None = None) -> TrainResult:
    """Train ``params`` on ``(x, y)`` with SGD; return new tensors (inputs are not modified).

    Update per step, as ``torch.optim.SGD``: ``g = grad + wd * p``; ``b = mu * b + g`` (``b = g`` on a fresh
    buffer); ``p = p - lr * b``.
    """
    epochs = cfg.epochs if epochs is None else epochs
    lr = cfg.lr if lr is None else lr
    names = list(params) if trainable is None else [n for n in params if n in set(trainable)]
    work = {k: v.detach().clone() for k, v in params.items()}
    for n in names:
        work[n].requires_grad_(True)
    bufs: dict[str, torch.Tensor] = {}
    if cfg.momentum and momentum is not None:
        bufs = {k: v.clone() for k, v in momentum.items() if k in names}
    total, steps, seen = 0.0, 0, 0
    if len(y) == 0 or epochs <= 0:
        return TrainResult(_detach(work), bufs or None, float("nan"), 0, 0)
    leaves = [work[n] for n in names]
    for idx in batches(len(y), cfg.batch_size, epochs, generator):
        out = functional_call(model, work, (x[idx],))
        loss = F.cross_entropy(out, y[idx])
        total_loss = loss + extra_loss(work) if extra_loss is not None else loss
        grads = torch.autograd.grad(total_loss, leaves)
        with torch.no_grad():
            for n, p, g in zip(names, leaves, grads):
                if cfg.weight_decay:
                    g = g.add(p, alpha=cfg.weight_decay)
                if cfg.momentum:
                    b = bufs.get(n)
                    if b is None:
                        b = bufs[n] = g.detach().clone()
                    else:
                        b.mul_(cfg.momentum).add_(g)
                    g = b
                p.sub_(g, alpha=lr)
        total += float(loss.detach()) * len(idx)
        seen += len(idx)
        steps += 1
    return TrainResult(_detach(work), bufs or None, total / max(seen, 1), steps, seen)


def _detach(params: Mapping[str, torch.Tensor]) -> Params:
    return {k: v.detach() for k, v in params.items()}
