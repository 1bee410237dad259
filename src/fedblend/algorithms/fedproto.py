"""FedProto (Tan et al., "FedProto: Federated Prototype Learning across Heterogeneous Clients", AAAI 2022).

Clients exchange class **prototypes** -- the mean representation (the body's output, ``model.features``) of each
class -- instead of model parameters; every client keeps its whole model.

* Local prototype of class ``j`` on client ``i`` (paper Eq. 4, its Alg. 1 "LocalUpdate"):
  ``C_i^(j) = 1/|D_ij| sum_{(x, y) in D_ij, y = j} f_i(x)``, computed after local training over the client's
  training data (as PFLlib's ``collect_protos``; the authors' code averages the representations seen during the
  last local epoch).
* Global prototype (Eq. 6): ``C^(j) = sum_{i in N_j} |D_ij| / N_j * C_i^(j)``, the mean over the clients that hold
  class ``j`` weighted by their sample counts of ``j`` (``weighting = "samples"``). Eq. 6 as printed carries an
  extra ``1/|N_j|`` in front of weights that already sum to 1, which would shrink every prototype by the number
  of clients holding the class; we read it as a typo and normalise once. The authors' code and PFLlib take the
  unweighted mean over clients (``weighting = "uniform"``).
* Local objective (Eq. 5 / 7): ``L = L_S(F_i(x), y) + lambda * L_R(f_i(x), C^(y))``: cross-entropy plus a
  regulariser pulling each sample's representation to the global prototype of its label (only for classes that
  have one). ``L_R`` is an L2 distance; the authors' code uses ``nn.MSELoss`` (mean over batch and feature
  dimension, ``distance = "mse"``, default); ``distance = "sq_l2"`` takes the squared norm per sample.
* Inference (``[eval] model = "proto"``, default; PFLlib's ``test_metrics``): predict the class of the nearest
  global prototype, ``argmin_j ||f_i(x) - C^(j)||^2``, an :class:`~fedblend.core.evaluation.EvalSpec` whose
  forward (:func:`prototype_logits`) scores the body's features against the prototypes. ``"head"``: the
  client's own model (body + its head). The forward's logits are ``2 <C^(j), f> - ||C^(j)||^2``, which is
  ``-||f - C^(j)||^2`` up to the term ``-||f||^2`` that is the same for every class: the same argmax and the same
  softmax (the loss reported is the cross-entropy of the logits ``-||f - C^(j)||^2``, FedProto's distance-based
  classifier); classes without a prototype are never predicted.

Only prototypes travel: up, one ``d``-vector per class the client holds (``arrays["protos"]``, class counts as
a list of numbers); down, one per class with a global prototype. No parameter is ever sent, so the method has no global
model. The global prototypes are those of the round's uploads, and a class no client of the round uploaded keeps
its previous prototype (``absent = "keep"``, default; the paper is silent); ``absent = "drop"`` drops it, as the
authors' code and PFLlib do (the same results whenever every class is uploaded, e.g. full participation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch.func import functional_call

from fedblend.algorithms.parts.prototypes import PROTOS, PrototypeUpload, num_classes, uploaded_counts
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.evaluation import EvalSpec
from fedblend.core.method import ClientCtx, Message, ServerCtx, State
from fedblend.core.training import Forward, LossTerm
from fedblend.models.zoo import FedModel


@dataclass(frozen=True)
class FedProtoOptions:
    """FedProto options; defaults follow the paper (Eq. 5-7) and, where it is silent, the authors' code."""

    CHOICES: ClassVar[dict] = {"weighting": ("samples", "uniform"), "distance": ("mse", "sq_l2"),
                               "absent": ("drop", "keep")}
    RANGES: ClassVar[dict] = {"lam": ">= 0"}

    lam: float = opt(1.0, "lambda of Eq. 5 (authors' code default 1)")
    weighting: str = opt("samples", "Eq. 6: weights |D_ij| / N_j (\"samples\") or the code's plain mean (\"uniform\")")
    distance: str = opt("mse", "L_R: \"mse\" (authors' code nn.MSELoss) or \"sq_l2\" (squared L2 per sample)")
    absent: str = opt("keep", 'a class no client uploaded this round: "keep" its last global prototype, or "drop" it '
                      "(authors' code, PFLlib: the clients holding it are then left without a prototype of their "
                      "own classes, scored 0 % that round)")


# ------------------------------------------------------------------------------------------------ pure parts
def average_prototypes(uploads: list[tuple[Params, Mapping[str, int]]], weighting: str = "samples") -> Params:
    """FedProto Eq. 6: per class, the mean of the uploaded prototypes weighted by the uploaders' sample counts of
    that class (``"samples"``) or equally (``"uniform"``), over the clients that uploaded the class."""
    out: Params = {}
    classes = sorted({c for protos, _ in uploads for c in protos}, key=int)
    for c in classes:
        vecs = [(protos[c], counts[c]) for protos, counts in uploads if c in protos]
        stacked = torch.stack([v.to(torch.float64) for v, _ in vecs])
        w = torch.tensor([float(n) if weighting == "samples" else 1.0 for _, n in vecs], dtype=torch.float64,
                         device=stacked.device)
        out[c] = ((w / w.sum()).unsqueeze(1) * stacked).sum(0).to(vecs[0][0].dtype)
    return out


def dense_prototypes(protos: Mapping[str, torch.Tensor], classes: int, like: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(C, d)`` matrix of the prototypes (zeros where a class has none) and a ``(C,)`` 0/1 mask of which exist."""
    ref = next(iter(protos.values())) if protos else like
    mat = torch.zeros(classes, ref.shape[-1], dtype=ref.dtype, device=ref.device)
    mask = torch.zeros(classes, dtype=ref.dtype, device=ref.device)
    for c, v in protos.items():
        mat[int(c)] = v
        mask[int(c)] = 1.0
    return mat, mask


def prototype_loss(params: Params, batch, protos: torch.Tensor, mask: torch.Tensor, lam: float,
                   distance: str) -> torch.Tensor:
    """FedProto Eq. 5's regulariser ``lambda * L_R(f(x), C^(y))`` over the batch; samples whose class has no
    global prototype contribute 0 (as the authors' code). ``"mse"``: mean over batch and features (code);
    ``"sq_l2"``: mean over the batch of ``||f(x) - C^(y)||^2``."""
    diff = (batch.features - protos[batch.y]) ** 2
    per_sample = diff.mean(1) if distance == "mse" else diff.sum(1)
    return lam * (per_sample * mask[batch.y]).mean()


def prototype_term(protos: Mapping[str, torch.Tensor], classes: int, lam: float, distance: str) -> LossTerm:
    mat, mask = dense_prototypes(protos, classes)
    return LossTerm(prototype_loss, {"protos": mat.detach(), "mask": mask, "lam": lam, "distance": distance},
                    needs_features=True, name="prototype")


def prototype_logits(model: FedModel, params: Params, x: torch.Tensor, with_features: bool, weight: torch.Tensor,
                     bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Nearest-prototype classification as a :class:`~fedblend.core.training.Forward`: the body's features ``f``
    scored ``2 <C^(j), f> - ||C^(j)||^2`` per class (``weight = 2 C``, ``bias = -||C||^2``,
    :func:`prototype_scores`), i.e. ``-||f - C^(j)||^2`` up to a term the same for every class."""
    feats = functional_call(model, dict(params), (x,), {"part": "features"})
    return F.linear(feats, weight, bias), feats


def prototype_scores(protos: Mapping[str, torch.Tensor], classes: int) -> dict[str, torch.Tensor]:
    """The arguments of :func:`prototype_logits`: ``weight = 2 C``, ``bias = -||C||^2``; a class without a
    prototype gets a bias of -1e30 (never predicted)."""
    mat, mask = dense_prototypes(protos, classes)
    bias = torch.where(mask > 0, -(mat**2).sum(1), torch.full_like(mask, -1e30))
    return {"weight": 2.0 * mat, "bias": bias}


# ------------------------------------------------------------------------------------------------ the method
@register_method
class FedProto(PrototypeUpload):
    name = "fedproto"
    display_name = "FedProto"
    options_cls = FedProtoOptions
    paper = "Tan et al., FedProto: Federated Prototype Learning across Heterogeneous Clients, AAAI 2022"

    def eval_models(self) -> dict[str, str]:
        return {"proto": "each client's own body after its last local training, classifying by the nearest "
                         "global prototype",
                "head": "each client's own model after its last local training (body "
                                                  "and its own head)"}

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        return {"protos": {}}

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        return Message({PROTOS: dict(server["protos"])}) if server["protos"] else Message()

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Eq. 6 over the round's uploads (``absent = "keep"``: over the previous prototypes)."""
        uploads = [(replies[c].params(PROTOS), uploaded_counts(replies[c])) for c in sorted(replies)]
        old = server["protos"] if self.opts.absent == "keep" else {}
        return {**server, "protos": {**old, **average_prototypes(uploads, self.opts.weighting)}}

    # ------------------------------------------------------------------------------------------ client
    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        glob = msg.params(PROTOS)
        if not glob or not self.opts.lam:
            return ()
        return (prototype_term(glob, num_classes(ctx.run), self.opts.lam, self.opts.distance),)

    def evaluate(self, msg: Message, cstate: State, ctx: ClientCtx) -> EvalSpec:
        """``"proto"``: the client's model classifying by the nearest global prototype (its own head until the
        server has prototypes); ``"head"``: the client's own model."""
        glob = msg.params(PROTOS)
        if self.traits.eval_choice == "head" or not glob:
            return super().evaluate(msg, cstate, ctx)
        scores = prototype_scores(glob, num_classes(ctx.run))
        return EvalSpec(cstate["params"], Forward(prototype_logits, scores, name="nearest_prototype"))
