"""ALA's weight learning (FedALA, Zhang et al., AAAI 2023, Alg. 1 lines 6-16, Eq. 4-6): its options
(:class:`ALAOptions`, the ``[ala]`` table) and pure functions of the two models, the weights and the client's data:
the blend of Eq. 4 (:func:`blend`), one weight update of Eq. 5-6 (:func:`ala_step`), the initial stage's stop rule
(:func:`converged`), the sampled s% of the data (:func:`sample_indices`) and the loop of one round
(:func:`learn_weights`). The transform that applies it to a
host method (state, memo, evaluation) is :mod:`fedblend.algorithms.ala`."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.parts.mix import interpolate
from fedblend.common.options import opt
from fedblend.common.params import Params, layer_of
from fedblend.models.zoo import FedModel


@dataclass(frozen=True)
class ALAOptions:
    """Options of ALA (the ``[ala]`` table, or ``[options]`` of ``fedala``). Defaults are the paper's."""

    CHOICES: ClassVar[dict] = {"sample": ("random", "window"), "record": ("last", "mean"),
                               "eval_stream": ("train", "eval")}
    RANGES: ClassVar[dict] = {"eta": ">= 0", "s": "(0, 100]", "p": "[1, 1000]", "threshold": ">= 0", "window": "[1, 100000]",
                              "cap": "[1, 1000000]", "batch_size": "[1, 1000000]"}

    eta: float = opt(1.0, "learning rate of the weight learning (paper: 1.0)")
    s: float = opt(80.0, "percent of the client's training data used for weight learning each round (paper: 80)")
    p: int = opt(1, "range of ALA in layers from the output (paper: 1 = output layer; code layer_idx = 2 * p)")
    threshold: float = opt(0.01, "initial stage: stop when std of the last `window` losses < threshold (README 0.01)")
    window: int = opt(10, "number of recorded epoch losses the std is taken over (code: 10)")
    cap: int = opt(100, "most weight-learning epochs in the initial stage (the code has none; a warning when hit)")
    sample: str = opt("random", '"random": a random s% subset (paper); "window": contiguous s% at a random offset '
                                "(code)")
    batch_size: int | None = opt(None, "mini-batch size of the weight learning; None = the client's training batch "
                                       "size")
    record: str = opt("last", "loss recorded per epoch for the stop rule: \"last\" batch's (code) or the epoch \"mean\"")
    eval_stream: str = opt("train", "eval.model = \"ala\": learn W from the next round's training stream (the blend the client"
                                    " then trains from; learned once) or from this round's \"eval\" stream (earlier "
                                    "runs)")


def ala_names(model: FedModel, p: int) -> list[str]:
    """Parameter names of the top ``p`` layers (paper Eq. 4: W_i^p has the shape of the p higher layers)."""
    return model.param_names(model.top_layers(p))


def blend(local: Mapping[str, torch.Tensor], glob: Mapping[str, torch.Tensor],
          weights: Mapping[str, torch.Tensor]) -> Params:
    """Eq. 4: global tensors below, ``local * (1 - W) + global * W`` on the tensors that have a weight."""
    return {**glob, **interpolate(glob, local, weights, names=weights)}


def ala_step(model: FedModel, local: Params, glob: Params, weights: Params, x: torch.Tensor,
             y: torch.Tensor, eta: float, features: torch.Tensor | None = None) -> tuple[Params, float]:
    """One weight-learning step on one batch (Eq. 5 / Eq. 7): only the top layers get gradients.

    Returns ``clip(W - eta * dL/dtheta_hat * (global - local), 0, 1)`` and the batch loss at the old W. When every
    ALA layer is a head layer, ``features`` (the frozen global body's output on ``x``) may be passed: the logits
    are then ``head(features)``, the same operations as the full forward pass, without recomputing the body.
    """
    top = {n: t.requires_grad_(True) for n, t in interpolate(glob, local, weights, names=weights).items()}
    if features is None:
        out = functional_call(model, {**glob, **top}, (x,))
    else:
        out = functional_call(model, {**glob, **top}, (features,), {"part": "head"})
    loss = F.cross_entropy(out, y)
    grads = torch.autograd.grad(loss, list(top.values()))
    new = {}
    with torch.no_grad():
        for (n, w), g in zip(weights.items(), grads):
            new[n] = (w - eta * g * (glob[n] - local[n])).clamp_(0.0, 1.0)
    return new, float(loss.detach())


def head_only(model: FedModel, names: list[str]) -> bool:
    """Whether every ALA tensor belongs to a head layer (then the body below is frozen at the global model)."""
    return all(layer_of(n) in model.head_layers for n in names)


def converged(losses: list[float], window: int, threshold: float) -> bool:
    """The authors' stop rule for the initial stage: more than ``window`` losses recorded and the population
    std of the last ``window`` of them below ``threshold``."""
    return len(losses) > window and float(np.std(losses[-window:])) < threshold


def sample_indices(n: int, s: float, mode: str, generator: torch.Generator) -> torch.Tensor:
    """D_i^{s,t}: ``int(s% * n)`` (at least 1) sample indices, in the order the epochs of this round visit them.

    ``random`` (paper, Sec. ALA): a uniformly random subset in random order. ``window`` (authors' code): the
    contiguous block ``[o, o + k)`` of the client's training data at a uniformly random offset ``o``.
    """
    k = min(n, max(1, int(s / 100.0 * n)))
    if mode == "random":
        return torch.randperm(n, generator=generator)[:k]
    if mode == "window":
        o = int(torch.randint(0, n - k + 1, (1,), generator=generator))
        return torch.arange(o, o + k)
    raise ValueError(f"unknown ALA sample mode {mode!r}")


@dataclass
class ALAResult:
    params: Params  # theta_hat (Eq. 4 with the learned W)
    weights: Params  # the learned W
    losses: list[float]  # recorded loss per weight-learning epoch
    epochs: int
    initial: bool  # whether this was the initial stage
    capped: bool  # initial stage stopped by the cap, not by the stop rule
    nonfinite: bool = False  # stopped at the first epoch whose loss is NaN / inf (non-finite models or data)


def learn_weights(model: FedModel, local: Params, glob: Params, weights: Params, x: torch.Tensor,
                  y: torch.Tensor, opts: ALAOptions, batch_size: int, generator: torch.Generator,
                  initial: bool) -> ALAResult:
    """Weight learning of one round (Alg. 1 lines 9-17): sample D_i^{s,t}, train W one epoch (or until the stop
    rule in the initial stage), then build theta_hat by Eq. 4. ``local`` / ``glob`` are not modified.

    An epoch whose loss is not finite ends the learning (``nonfinite``): no stop rule can hold on NaN losses, so
    the initial stage would otherwise run to its cap before the run's divergence check reports the cause."""
    local = {n: local[n].detach() for n in weights}
    glob = {k: v.detach() for k, v in glob.items()}
    w = {n: v.detach().clone() for n, v in weights.items()}
    losses: list[float] = []
    capped = nonfinite = False
    if len(y) > 0:
        idx = sample_indices(len(y), opts.s, opts.sample, generator)
        parts = list(torch.split(idx, batch_size))
        feats: list[torch.Tensor | None] = [None] * len(parts)
        cache = head_only(model, list(w))  # the body is frozen: its output per batch is the same every epoch
        while True:
            batch_losses, sizes = [], []
            for i, b in enumerate(parts):
                if cache and feats[i] is None:
                    with torch.no_grad():
                        feats[i] = functional_call(model, glob, (x[b],), {"part": "features"})
                w, loss = ala_step(model, local, glob, w, x[b], y[b], opts.eta, feats[i])
                batch_losses.append(loss)
                sizes.append(len(b))
            losses.append(batch_losses[-1] if opts.record == "last" else float(np.average(batch_losses, weights=sizes)))
            nonfinite = not math.isfinite(losses[-1])
            if nonfinite or not initial or converged(losses, opts.window, opts.threshold):
                break
            if len(losses) >= opts.cap:
                capped = True
                break
    return ALAResult(blend({**glob, **local}, glob, w), w, losses, len(losses), initial, capped, nonfinite)


def fingerprint(params: Mapping[str, torch.Tensor]) -> str:
    """A digest of names, dtypes, shapes and bytes of ``params`` (memo keys; no tensor copies kept)."""
    h = hashlib.blake2b(digest_size=16)
    for n, t in params.items():
        t = t.detach().cpu().contiguous()
        h.update(f"{n}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy())  # the buffer itself, no copy
    return h.hexdigest()


def weight_summary(model: FedModel, weights: Mapping[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per layer: ``[mean, q10, q50, q90]`` of the elements of W (weight and bias together)."""
    out: dict[str, list[float]] = {}
    for layer in model.layers:
        vals = [w.reshape(-1) for n, w in weights.items() if layer_of(n) == layer]
        if vals:
            v = torch.cat(vals).double()
            q = torch.quantile(v, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64, device=v.device)) if v.numel() else v
            out[layer] = [float(v.mean())] + [float(a) for a in q]
    return out
