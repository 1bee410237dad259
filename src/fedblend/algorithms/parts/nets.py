"""Small functional networks: MLPs and LSTMs as parameter dicts, soft (polyak) updates (server-side learners:
pFedHN's and pFedLA's hypernetworks, pFedRLLA's agent and embedding network; their optimizers are
:mod:`fedblend.core.optim`).

Networks are not ``nn.Module`` objects: a network is a ``dict[str, Tensor]`` and a pure function applies it, so
its weights are plain state (checkpointed bit for bit, moved by the state codec). Initialisation follows PyTorch's
defaults for ``nn.Linear`` / ``nn.LSTM`` (uniform in ``+-1/sqrt(fan_in)`` resp. ``+-1/sqrt(hidden)``), drawn
from a passed-in generator (never the global RNG).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

from fedblend.algorithms.parts.mix import interpolate

Net = dict[str, torch.Tensor]


def _uniform(shape: Sequence[int], bound: float, gen: torch.Generator) -> torch.Tensor:
    return (torch.rand(*shape, generator=gen, dtype=torch.float32) * 2 - 1) * bound


def mlp_init(sizes: Sequence[int], gen: torch.Generator) -> Net:
    """Linear layers ``sizes[0] -> sizes[1] -> ... -> sizes[-1]`` (``l{i}.weight``, ``l{i}.bias``)."""
    net: Net = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        bound = 1.0 / math.sqrt(a)
        net[f"l{i}.weight"] = _uniform((b, a), bound, gen)
        net[f"l{i}.bias"] = _uniform((b,), bound, gen)
    return net


def mlp(net: Mapping[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """ReLU between layers, no activation after the last one."""
    n = len(net) // 2
    for i in range(n):
        x = x @ net[f"l{i}.weight"].T + net[f"l{i}.bias"]
        if i < n - 1:
            x = torch.relu(x)
    return x


def lstm_init(input_size: int, hidden: int, layers: int, gen: torch.Generator, prefix: str = "lstm") -> Net:
    """A stacked LSTM (PyTorch's gate layout i, f, g, o)."""
    net: Net = {}
    bound = 1.0 / math.sqrt(hidden)
    for layer in range(layers):
        d = input_size if layer == 0 else hidden
        net[f"{prefix}{layer}.w_ih"] = _uniform((4 * hidden, d), bound, gen)
        net[f"{prefix}{layer}.w_hh"] = _uniform((4 * hidden, hidden), bound, gen)
        net[f"{prefix}{layer}.b_ih"] = _uniform((4 * hidden,), bound, gen)
        net[f"{prefix}{layer}.b_hh"] = _uniform((4 * hidden,), bound, gen)
    return net


def lstm(net: Mapping[str, torch.Tensor], seq: torch.Tensor, prefix: str = "lstm") -> torch.Tensor:
    """Run a stacked LSTM over ``seq`` (batch, time, features) from zero state; the last layer's outputs."""
    layers = sum(1 for k in net if k.startswith(prefix) and k.endswith(".w_ih"))
    out = seq
    for layer in range(layers):
        w_ih, w_hh = net[f"{prefix}{layer}.w_ih"], net[f"{prefix}{layer}.w_hh"]
        b = net[f"{prefix}{layer}.b_ih"] + net[f"{prefix}{layer}.b_hh"]
        hidden = w_hh.shape[1]
        h = seq.new_zeros(seq.shape[0], hidden)
        c = seq.new_zeros(seq.shape[0], hidden)
        steps = []
        for t in range(out.shape[1]):
            gates = out[:, t] @ w_ih.T + h @ w_hh.T + b
            i, f, g, o = gates.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            steps.append(h)
        out = torch.stack(steps, dim=1)
    return out


def polyak(target: Mapping[str, torch.Tensor], source: Mapping[str, torch.Tensor], rho: float) -> Net:
    """Soft target update ``target <- rho * target + (1 - rho) * source`` (DDPG, Lillicrap et al. 2015)."""
    return interpolate(target, source, rho)
