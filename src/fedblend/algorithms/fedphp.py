"""FedPHP (Li et al., "FedPHP: Federated Personalization with Inherited Private Models", ECML PKDD 2021).

The server is FedAvg's. Every client additionally keeps an inherited private model (HPM) ``v_i``, "a temporal
ensembling of its historical personalized models" (abstract), that it never sends and that supervises its next
personalization. In each round the client:

1. starts local training from the received global model ``w``;
2. trains with ``(1 - lambda) CE(w; x, y) + lambda * D(w, v_i; x)``, the frozen HPM as teacher. The paper explores
   several knowledge transfers; the authors' code (``lxcnju/FedRepo``, ``algorithms/fedphp.py``) has two, both
   here: ``transfer = "kd"``: the soft cross-entropy ``-sum softmax(v(x) / T) log softmax(w(x))`` (temperature
   ``T = 4`` on the teacher only, as the code); ``transfer = "mmd"``: the MMD between the two models' features
   with five Gaussian kernels whose bandwidths scale the batch's mean squared distance (the code's
   ``mmd_rbf_noaccelerate``). ``transfer = "mmd-pfllib"``: PFLlib's MMD with fixed bandwidths 10, 15, 20, 50;
3. uploads the trained ``w`` (FedAvg aggregates) and updates its HPM by a moving average
   ``v_i <- mu_i v_i + (1 - mu_i) w`` whose momentum grows with the client's participations (authors' code,
   ``schedule = "participation"``): ``mu_i = min(mu * k_i / max(floor(rho T), 1), mu)``, ``k_i`` the client's
   earlier participations, ``rho T`` the expected number (``rho = expected_join``, ``T`` = rounds). So the first
   participation sets the HPM to the trained model and later ones keep more and more history.
   ``schedule = "round"``: PFLlib's ``mu_t = mu * t / T`` (``t`` the 0-based round).

The HPM starts as the common initial model (the authors' code), so a client's first round distils from it. The
personalized model evaluated is the HPM (``[eval] model = "hpm"``: the authors' code tests it; ``"trained"``: the
client's last trained model, what PFLlib evaluates); a client never contacted evaluates the global model. With
``lam = 0`` and ``mu = 0`` the global trajectory is FedAvg's exactly and the HPM is the client's last trained
model. Not reproduced from the authors' code: its gradient-norm clipping.

Defaults ``mu = 0.9`` (the code's constant; FedALA's tuned value) and ``lam = 0.01`` (FedALA appendix).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.parts.mix import interpolate
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, clone
from fedblend.core.method import ClientCtx, Message, State, Traits
from fedblend.core.training import LossTerm


@dataclass(frozen=True)
class FedPHPOptions:
    """FedPHP options; defaults follow the authors' code and FedALA's tuned values (appendix)."""

    CHOICES: ClassVar[dict] = {"transfer": ("kd", "mmd", "mmd-pfllib"), "schedule": ("participation", "round")}
    RANGES: ClassVar[dict] = {"mu": "[0, 1]", "lam": "[0, 1]", "temperature": "> 0", "expected_join": "(0, 1]"}

    mu: float = opt(0.9, "largest momentum of the HPM moving average")
    lam: float = opt(0.01, "weight of the knowledge transfer: (1 - lam) CE + lam D")
    transfer: str = opt("kd", "\"kd\" (soft CE to the HPM), \"mmd\" (authors' adaptive-bandwidth MMD), \"mmd-pfllib\"")
    temperature: float = opt(4.0, "KD temperature on the teacher's logits (authors' code: 4)")
    schedule: str = opt("participation", 'momentum grows with participations (code) or with the round ("round", '
                                         "PFLlib)")
    expected_join: float = opt(1.0, "rho: expected share of rounds a client joins (T1's uniform [0.6, 1]: 0.8)")


# ------------------------------------------------------------------------------------------------ pure parts
def hpm_momentum(opts: FedPHPOptions, joins: int, rnd: int, rounds: int) -> float:
    """``mu_i`` of the HPM update: ``min(mu * k_i / max(floor(rho T), 1), mu)`` (``"participation"``, ``k_i`` =
    ``joins`` before this one) or ``mu * t / T`` (``"round"``, ``t`` = ``rnd``, 0-based)."""
    if opts.schedule == "round":
        return opts.mu * rnd / max(rounds, 1)
    return min(opts.mu * joins / max(int(opts.expected_join * rounds), 1), opts.mu)


def moving_average(hpm: Params, trained: Params, mu_t: float) -> Params:
    """The HPM update ``v <- mu_t v + (1 - mu_t) w``."""
    return {k: v.detach() for k, v in interpolate(hpm, trained, mu_t).items()}


def gaussian_kernels(a: torch.Tensor, b: torch.Tensor, bandwidths: tuple[float, ...] | None) -> torch.Tensor:
    """Sum of Gaussian kernels ``exp(-||x - y||^2 / s)`` over the joint sample ``[a; b]``. ``bandwidths=None``:
    five scales ``s_0 * 2^i`` with ``s_0`` = mean off-diagonal squared distance / 4 (not differentiated)."""
    z = torch.cat([a, b])
    d = torch.cdist(z, z) ** 2
    if bandwidths is None:
        n = len(z)
        base = (d.detach().sum() / max(n * n - n, 1) + 1e-8) / 4.0
        bandwidths = tuple(base * 2.0**i for i in range(5))
    return sum(torch.exp(-d / s) for s in bandwidths)


def mmd(a: torch.Tensor, b: torch.Tensor, bandwidths: tuple[float, ...] | None = None) -> torch.Tensor:
    """Biased empirical MMD^2 between samples ``a`` and ``b`` (equal sizes) with :func:`gaussian_kernels`."""
    k = gaussian_kernels(a, b, bandwidths)
    n = len(a)
    return (k[:n, :n] + k[n:, n:] - k[:n, n:] - k[n:, :n]).mean()


PFLLIB_BANDWIDTHS = (20.0, 30.0, 40.0, 100.0)  # PFLlib's exp(-0.5 d / a), a = 10, 15, 20, 50, as exp(-d / s)


def transfer_loss(params: Params, batch, hpm: Params, lam: float, transfer: str, temperature: float
                  ) -> torch.Tensor:
    """The part of ``(1 - lam) CE + lam D`` that plain training does not add: ``lam (D - CE)``."""
    ce = F.cross_entropy(batch.logits, batch.y)
    with torch.no_grad():
        teacher = functional_call(batch.model, hpm, (batch.x,), {} if transfer == "kd" else {"part": "features"})
    if transfer == "kd":
        d = -(F.softmax(teacher / temperature, 1) * F.log_softmax(batch.logits, 1)).sum(1).mean()
    else:
        d = mmd(batch.features, teacher, None if transfer == "mmd" else PFLLIB_BANDWIDTHS)
    return lam * (d - ce)


# ------------------------------------------------------------------------------------------------ the method
@register_method
class FedPHP(FedAvg):
    name = "fedphp"
    display_name = "FedPHP"
    options_cls = FedPHPOptions
    paper = "Li et al., FedPHP: Federated Personalization with Inherited Private Models, ECML PKDD 2021"

    def init_client(self, ctx: ClientCtx) -> State:
        """The HPM starts as the common initial model (authors' code); ``joins`` counts participations."""
        return {**super().init_client(ctx), "hpm": clone(ctx.run.init_params), "joins": 0}

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        if not self.opts.lam:
            return ()
        args = {"hpm": cstate["hpm"], "lam": self.opts.lam, "transfer": self.opts.transfer,
                "temperature": self.opts.temperature}
        return (LossTerm(transfer_loss, args, needs_features=self.opts.transfer != "kd", name="transfer"),)

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """FedAvg's local training, then the HPM moving average on the trained model."""
        res, cstate = yield from super().local_training(params, msg, cstate, ctx)
        mu_i = hpm_momentum(self.opts, cstate["joins"], ctx.rnd, ctx.run.rounds)
        cstate = {**cstate, "hpm": moving_average(cstate["hpm"], res.params, mu_i), "joins": cstate["joins"] + 1}
        return res, cstate

    def eval_models(self) -> dict[str, str]:
        return {"hpm": "each client's inherited private model (HPM; the global model for a client never "
                       "contacted)",
                "trained": "each client's model after its last local training (what PFLlib evaluates; the global "
                           "model for a client never contacted)"}

    def declare(self, choice: str) -> Traits:
        """``[eval] model = "trained"`` keeps the client's last trained model to evaluate it."""
        return replace(super().declare(choice), keeps_model=choice == "trained")

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        if not cstate["joins"]:
            return self.client_init(msg, cstate, ctx)
        return cstate["params"] if self.traits.eval_choice == "trained" else cstate["hpm"]
