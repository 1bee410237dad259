"""Helpers shared by the per-method tests."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedblend.core.client import drive
from fedblend.core.method import train_now

FULL_BATCH = 10_000  # one mini-batch per epoch: one SGD step per epoch, so a step can be computed by hand


def perturbed(params, scale=0.1, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in params.items()}


def ce_grad(model, params, x, y):
    """Gradient of the mean cross-entropy of the model with ``params`` on ``(x, y)``, by autograd."""
    leaves = {k: v.detach().clone().requires_grad_(True) for k, v in params.items()}
    loss = F.cross_entropy(functional_call(model, leaves, (x,)), y)
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values()))))


def specs_of(sim, cid, msg, state=None):
    """Run client ``cid``'s training half on ``msg``; return the specs it yielded, their results and its state."""
    ctx = sim.client_ctx(cid, sim.next_round)
    state = sim.method.init_client(ctx) if state is None else state
    log = []

    def execute(spec):
        res = train_now(spec, ctx)
        log.append((spec, res))
        return res

    reply, state = drive(sim.method.client_step("train", msg, state, ctx), execute)
    return log, reply, state


def toy():
    """A tiny float64 linear model, its parameters and three batches."""
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).double()
    params = {k: torch.randn(v.shape, generator=g, dtype=torch.float64) for k, v in model.named_parameters()}
    data = [(torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randint(0, 2, (6,), generator=g))
            for _ in range(3)]
    return model, params, data


def client_params(sim):
    return {c: s["params"] for c, s in sim.store.states.items()}
