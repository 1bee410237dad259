"""FedAMP (Huang et al., "Personalized Cross-Silo Federated Learning on Non-IID Data", AAAI 2021).

Attentive message passing. The server keeps every client's last uploaded model ``w_j`` and builds, for each
client ``i``, a personalized cloud model (paper Eq. 5-7)::

    u_i = xi_i1 w_1 + ... + xi_iM w_M
    xi_ij = alphaK * A'(||w_i - w_j||^2)          (j != i)
    xi_ii = 1 - sum_{j != i} xi_ij                 (the self weight)

with the attention-inducing function ``A(x) = 1 - exp(-x / sigma)`` (Sec. 5), so ``A'(x) = exp(-x / sigma) / sigma``
-- similar clients receive large weights. The client then solves its proximal problem (Eq. 8)::

    w_i = argmin_w  F_i(w) + lambda / (2 alphaK) ||w - u_i||^2

by local SGD, here with :func:`fedblend.algorithms.parts.proximal.proximal_term` anchored at ``u_i`` with coefficient
``lambda / alphaK``, and uploads ``w_i``.

Choices where the paper is silent (see ``docs/methods/fedamp.md``):

* the local solver starts from the client's own model ``w_i`` (``start = "local"``, as PFLlib's client, so that
  ``lambda = 0`` is exactly Local training); ``start = "cloud"`` starts it from ``u_i``;
* partial participation (the paper's cross-silo setting has every client in every round): ``u_i`` is built from
  the last upload of every client that has uploaded at least once (and the client's own stored model); clients
  never heard from are left out;
* evaluation: every client's own model after its last local training (PFLlib; the paper's personalized model
  ``w_i``).

Defaults ``alphaK = 1000``, ``lambda = 1``, ``sigma = 0.1``: FedALA's tuned values (its appendix), which the
FedAPA comparison inherits.

``fedamp+ala`` (FedALA, Zhang et al. AAAI 2023, Table 4 and "Applicability of ALA": ALA "only modifies the local
initialization"): FedAMP has no global model, but its server sends every client a model to train from, ``u_i``
(``trains_from_received``). With a transform that blends the received model (``requires_received``),
:meth:`FedAMP.client_init` hands it ``u_i`` whatever ``start`` says, and the client trains from ALA's
``theta_hat = w_i + (u_i - w_i) * W`` (FedALA Eq. 4, Alg. 1 lines 6-16; ``start = "local"`` is W = 0, ``"cloud"``
W = 1), while Eq. 8's proximal term stays centred at ``u_i`` (:meth:`FedAMP.loss_terms` reads the message, not
the start).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.parts.proximal import proximal_term
from fedblend.algorithms.parts.rows import aggregate_row, sq_distances
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, stack_copies, with_rows
from fedblend.core.method import ClientCtx, Message, Method, ServerCtx, State, Traits
from fedblend.core.training import LossTerm


@dataclass(frozen=True)
class FedAMPOptions:
    """FedAMP options; defaults are FedALA's tuned values (appendix) for the paper's hyperparameters."""

    CHOICES: ClassVar[dict] = {"start": ("local", "cloud")}
    RANGES: ClassVar[dict] = {"alpha_k": "> 0", "lam": ">= 0", "sigma": "> 0"}

    alpha_k: float = opt(1000.0, "alphaK: step size of the attention gradient step (Eq. 6)")
    lam: float = opt(1.0, "lambda: weight of the proximal pull to u_i (Eq. 8, as lambda / (2 alphaK))")
    sigma: float = opt(0.1, "scale of the attention-inducing function A(x) = 1 - exp(-x / sigma)")
    start: str = opt("local", "local SGD starts from the client's own model (\"local\") or from u_i (\"cloud\"); with "
                              "+ala from ALA's blend of both instead (FedALA Table 4)")


def attention_weights(flat: torch.Tensor, cid: int, available: torch.Tensor, alpha_k: float,
                      sigma: float) -> torch.Tensor:
    """Row ``xi_i`` of Eq. 7 over the stacked flat models ``flat`` (``(M, P)``): :func:`attention_row` of the
    squared distances ``d_ij = ||w_i - w_j||^2`` (computed in float64)."""
    flat = flat.to(torch.float64)
    return attention_row(((flat - flat[cid]) ** 2).sum(1), cid, available, alpha_k, sigma)


def attention_row(d: torch.Tensor, cid: int, available: torch.Tensor, alpha_k: float, sigma: float) -> torch.Tensor:
    """Row ``xi_i`` of Eq. 7 from the squared distances ``d`` (float64, ``d_ij = ||w_i - w_j||^2``): ``alphaK *
    exp(-d_ij / sigma) / sigma`` for every other available client ``j``, 0 for unavailable ones, and the self
    weight ``1 - sum_{j != i} xi_ij``."""
    xi = alpha_k * torch.exp(-d / sigma) / sigma
    xi = torch.where(available.bool(), xi, torch.zeros_like(xi))
    xi[cid] = 0.0
    xi[cid] = 1.0 - xi.sum()
    return xi


def negative_self_weight_text(alpha_k: float, sigma: float, m: int) -> str:
    """The warning for a negative self weight ``xi_ii`` (see :meth:`FedAMP.cloud_model`)."""
    bound = sigma / max(1, m - 1)
    return (f"FedAMP: a self weight xi_ii < 0 (alpha_k = {alpha_k:g}, sigma = {sigma:g}): the attention weights are "
            f"not a convex combination, u_i extrapolates beyond the clients' models and the proximal pull towards it "
            f"can diverge. alpha_k <= sigma / (M - 1) = {bound:.3g} keeps every xi_ii >= 0 however close the models "
            f"are (docs/methods/fedamp.md)")


@register_method
class FedAMP(Method):
    name = "fedamp"
    display_name = "FedAMP"
    options_cls = FedAMPOptions
    paper = "Huang et al., Personalized Cross-Silo Federated Learning on Non-IID Data (FedAMP), AAAI 2021"

    def declare(self, choice: str) -> Traits:
        """No global model, but every client trains from its cloud model u_i, which +ala blends with w_i
        (FedALA Table 4); a client evaluates its own model."""
        return Traits(global_model=False, trains_from_received=True, evaluates_own_model=True)

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's own model after its last local training (w_i of Eq. 8)"}

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        """Every stored w_j starts at the common initial model; ``seen[j]`` marks clients that have uploaded."""
        m = sctx.run.num_clients
        return {"models": stack_copies(sctx.run.init_params, m),
                "seen": torch.zeros(m, dtype=torch.float64, device=sctx.run.device)}

    def cloud_model(self, server: State, cid: int) -> Params:
        """Eq. 5-7: ``u_i = sum_j xi_ij w_j``. Warns (once per setting) when the self weight is negative: the
        weights then do not form the convex combination Eq. 7 intends, ``u_i`` extrapolates beyond the stored
        models, and the proximal pull towards it can diverge."""
        models = server["models"]
        xi = attention_row(sq_distances(models, cid), cid, server["seen"], self.opts.alpha_k, self.opts.sigma)
        if float(xi[cid]) < 0 and self.opts.lam:  # with lam = 0, u_i pulls nothing
            warnings.warn(negative_self_weight_text(self.opts.alpha_k, self.opts.sigma, len(xi)), stacklevel=2)
        return aggregate_row(xi, models)

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        return Message({"params": self.cloud_model(server, cid)})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Store every upload as that client's w_j."""
        seen = server["seen"].clone()
        seen[sorted(replies)] = 1.0
        return {**server, "models": with_rows(server["models"], {c: r.params() for c, r in replies.items()}),
                "seen": seen}

    # ------------------------------------------------------------------------------------------ client
    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The start of local training: ``w_i`` (``start = "local"``) or ``u_i`` (``"cloud"``). A transform that
        blends the received model (ALA) gets ``u_i`` and makes the start itself (FedALA Alg. 1 replaces the host's
        initialisation), so ``start`` does not apply then."""
        if self.opts.start == "local" and not any(t.traits.requires_received for t in self.transforms):
            return dict(cstate["params"])
        return {**cstate["params"], **msg.params()}

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        """Eq. 8's proximal pull ``lambda / (2 alphaK) ||w - u_i||^2`` (FedProx's term with mu = lambda / alphaK),
        centred at the received ``u_i`` whatever the training starts from (``params``: ALA's blend under +ala)."""
        if not self.opts.lam:
            return ()
        return (proximal_term(msg.params(), self.opts.lam / self.opts.alpha_k),)
