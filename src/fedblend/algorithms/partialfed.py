"""PartialFed (Sun, Huo, Yang, Bai, "PartialFed: Cross-Domain Personalized Federated Learning via Partial
Initialization", NeurIPS 2021), the adaptive variant PartialFed-Adaptive.

A client does not overwrite its model with the received global model: it initialises each layer ``l`` from
either the global parameters or its own parameters of the previous round (Sec. 3, the loading strategy
``A^c_t``, one choice per layer), trains locally, and uploads the whole model; the server averages (FedAvg).
PartialFed-Fix fixes the choice by hand; PartialFed-Adaptive (Sec. 3.3) learns it per client. This module
implements the adaptive variant as follows (the paper text was not available to us in full; every step below
that is our reading is an option and listed in ``docs/methods/partialfed.md``):

* the strategy is one number per layer, ``s_l in [0, 1]`` (the weight of "load global" in the relaxed choice
  ``s_l theta_g + (1 - s_l) theta_local``), kept in the client state, starting at 1 (load everything: FedAvg);
* each round, before local training, ``s`` is learned on ``strategy_fraction`` of an epoch of the client's
  training batches with both models frozen: per batch,
  ``s_l <- clip(s_l - eta * mean_l(dL/dtheta_mix * (theta_g - theta_local)), 0, 1)`` on the relaxed model
  ``theta_mix = theta_local + (theta_g - theta_local) * s`` (the gradient of the loss w.r.t. ``s_l``, averaged
  over the layer's elements, as the PFLlib implementation does), followed by the Gumbel-softmax relaxation of
  the binary choice, ``s_l <- softmax((log(s_l, 1 - s_l) + G) / tau)[0]`` with Gumbel noise ``G`` and a
  temperature ``tau = tau0 * tau_decay^k`` annealed over the client's rounds ``k`` (``gumbel = false``: no
  relaxation);
* the initialisation then loads layer ``l`` from the global model if ``s_l >= 0.5`` and keeps the local layer
  otherwise (``load = "hard"``: the paper's partial loading); ``load = "soft"`` starts from ``theta_mix``.

While a client's model equals the global one (its first round), there is nothing to choose and ``s`` is not
learned. Evaluation: each client's model after its last local training.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.parts.ownloop import batch_loss, batch_stream, grad, steps_per_epochs
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, layer_of
from fedblend.core.method import ClientCtx, Message, State, Traits


@dataclass(frozen=True)
class PartialFedOptions:
    CHOICES: ClassVar[dict] = {"load": ("hard", "soft"), "unit": ("layer", "tensor")}
    RANGES: ClassVar[dict] = {"eta": ">= 0", "strategy_fraction": "(0, 1]", "tau0": "> 0", "tau_decay": "(0, 1]"}

    eta: float = opt(1.0, "step size of the strategy update")
    strategy_fraction: float = opt(0.5, "share of an epoch's batches the strategy learns on each round")
    gumbel: bool = opt(True, "Gumbel-softmax relaxation of the binary choice after each strategy step")
    tau0: float = opt(5.0, "initial Gumbel-softmax temperature (PFLlib: 5)")
    tau_decay: float = opt(0.965, "temperature decay per participating round (PFLlib: 0.965)")
    load: str = opt("hard", '"hard": load layer l from the global model iff s_l >= 0.5; "soft": s-weighted mix')
    unit: str = opt("layer", '"layer": one choice per layer (paper); "tensor": per parameter tensor (PFLlib)')


def unit_of(name: str, unit: str) -> str:
    return layer_of(name) if unit == "layer" else name


def partial_load(glob: Mapping[str, torch.Tensor], local: Mapping[str, torch.Tensor],
                 load_global: Mapping[str, bool], unit: str = "layer") -> Params:
    """Partial initialisation: each tensor from ``glob`` where its unit is marked global, else from ``local``."""
    return {k: (glob[k] if load_global[unit_of(k, unit)] else local[k]) for k in glob}


def mix(glob: Mapping[str, torch.Tensor], local: Mapping[str, torch.Tensor], s: Mapping[str, torch.Tensor],
        unit: str = "layer") -> Params:
    """The relaxed choice ``theta_local + (theta_g - theta_local) * s_unit``."""
    return {k: local[k] + (glob[k] - local[k]) * s[unit_of(k, unit)] for k in glob}


def strategy_step(s: Params, glob: Params, local: Params, loss, eta: float, unit: str) -> Params:
    """``s_u <- clip(s_u - eta * mean_{k in u}(dL/dtheta_mix_k * (theta_g - theta_local)_k), 0, 1)``."""
    g = grad(loss, mix(glob, local, s, unit))
    num: dict[str, torch.Tensor] = {}
    cnt: dict[str, int] = {}
    for k in glob:
        u = unit_of(k, unit)
        num[u] = num.get(u, 0.0) + (g[k] * (glob[k] - local[k])).sum()
        cnt[u] = cnt.get(u, 0) + glob[k].numel()
    return {u: (s[u] - eta * num[u] / cnt[u]).clamp(0.0, 1.0) for u in s}


def gumbel_relax(s: Params, tau: float, generator: torch.Generator) -> Params:
    """``softmax((log(s, 1 - s) + G) / tau)[0]`` per unit, ``G`` i.i.d. standard Gumbel."""
    out = {}
    for u in sorted(s):
        p = s[u].double().clamp(1e-12, 1 - 1e-12)
        logits = torch.stack([p.log(), (1 - p).log()])
        r = torch.rand(2, generator=generator, dtype=torch.float64).to(p.device)  # drawn on the CPU on any device
        noise = -torch.log(-torch.log(r.clamp_min(1e-20)))
        out[u] = torch.softmax((logits + noise) / tau, 0)[0].to(s[u].dtype)
    return out


@register_method
class PartialFed(FedAvg):
    name = "partialfed"
    display_name = "PartialFed"
    options_cls = PartialFedOptions
    paper = ("Sun et al., PartialFed: Cross-Domain Personalized Federated Learning via Partial Initialization, "
             "NeurIPS 2021 (PartialFed-Adaptive)")

    def declare(self, choice: str) -> Traits:
        """The client keeps its model; the strategy is learned by plain code before the TrainSpec; each client's
        share of units taken from the global model is recorded per round (``stats_per_client``)."""
        return replace(super().declare(choice), keeps_model=True, own_loop=True,
                       client_stats=("partialfed_global_share",))

    def init_client(self, ctx: ClientCtx) -> State:
        units = sorted({unit_of(k, self.opts.unit) for k in ctx.run.init_params})
        return {**super().init_client(ctx), "strategy": {u: torch.ones(()) for u in units}, "rounds": 0}

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The partial initialisation from the received global model and the client's model by its strategy."""
        glob, local, s = msg.params(), cstate["params"], cstate["strategy"]
        if self.opts.load == "soft":
            return mix(glob, local, s, self.opts.unit)
        return partial_load(glob, local, {u: bool(v >= 0.5) for u, v in s.items()}, self.opts.unit)

    def learn_strategy(self, msg: Message, cstate: State, ctx: ClientCtx) -> State:
        glob, local = msg.params(), cstate["params"]
        if all(torch.equal(glob[k], local[k]) for k in glob):
            return cstate
        x, y, bs = ctx.data.train_x, ctx.data.train_y, ctx.train.batch_size
        steps = math.ceil(self.opts.strategy_fraction * steps_per_epochs(len(y), bs, 1, ctx.train.drop_last))
        stream = batch_stream(len(y), bs, ctx.tree.torch("strategy"), ctx.train.drop_last, ctx.train.shuffle)
        tau = self.opts.tau0 * self.opts.tau_decay ** int(cstate["rounds"])
        s, noise = dict(cstate["strategy"]), ctx.tree.torch("gumbel")
        for _ in range(steps):
            idx = next(stream)
            s = strategy_step(s, glob, local, batch_loss(ctx.model, x[idx], y[idx]), self.opts.eta, self.opts.unit)
            if self.opts.gumbel:
                s = gumbel_relax(s, tau, noise)
        ctx.stats["partialfed_global_share"] = sum(float(v >= 0.5) for v in s.values()) / len(s)
        return {**cstate, "strategy": s, "rounds": int(cstate["rounds"]) + 1}

    def before_training(self, msg: Message, cstate: State, ctx: ClientCtx) -> State:
        """Learn the strategy (Sec. 3.3) before the template's partial initialisation, local SGD, upload."""
        return self.learn_strategy(msg, cstate, ctx)

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's model after its last local training (started from its partial "
                           "initialisation)"}

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        return cstate["params"]
