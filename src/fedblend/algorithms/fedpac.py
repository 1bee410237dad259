"""FedPAC (Xu, Tong, Huang, "Personalized Federated Learning with Feature Alignment and Classifier
Collaboration", ICLR 2023).

Per round, for every joining client ``i`` (paper Alg. 1):

* it receives the global feature extractor ``theta^f`` (body) and its personalized classifier ``phi_i`` (head);
* on the received model it extracts its feature statistics (Sec. 4.3): label distribution ``p_i(k)``, class
  means ``mu_ik``, ``h_ik = p_i(k) mu_ik`` and the variance term
  ``V_i = sum_k p_i(k) tr(E[f f^T | k]) - sum_k p_i(k)^2 ||mu_ik||^2`` (divided by ``n_i`` as the authors' code);
* local training (Sec. 4.2): ``head_epochs`` epoch(s) of the classifier with the body frozen, then the body
  with the classifier frozen on ``CE + lambda * R_i``, the feature-alignment regulariser (Eq. 5)
  ``R_i = 1/n sum ||f(x) - c_y||^2`` towards the global class centroids ``c_k`` (by default divided by the
  feature dimension as the authors' ``MSELoss``, for which their lambda = 1 is set);
* it uploads body, head, ``V_i``, ``h_i`` and its local class centroids ``c_ik`` (means of ``f(x)`` per class on
  its training data after training) with the class counts.

The server (Sec. 4.3) averages the bodies by data size (FedAvg), aggregates the centroids
``c_k = sum_i n_ik c_ik / sum_i n_ik`` (Eq. 6), and for every uploader ``i`` solves the classifier-combination
quadratic program (Eq. 9-10) over the round's uploaders

    min_{alpha in simplex}  sum_j alpha_j^2 V_j + sum_k || sum_j alpha_j (h_ik - h_jk) ||^2
                          = alpha^T (diag(V) + D_i) alpha,    D_i[j1, j2] = sum_k <h_ik - h_j1k, h_ik - h_j2k>

with ``scipy.optimize.minimize`` (SLSQP, simplex constraints), and keeps ``phi_i = sum_j alpha_ij phi_j`` to send
client ``i`` next time. See ``docs/methods/fedpac.md``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.parts.features import features_of
from fedblend.algorithms.parts.prototypes import num_classes
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, select, weighted_average
from fedblend.core.method import ClientCtx, Message, Method, RunInfo, ServerCtx, State, Traits
from fedblend.core.template import record_training, train_spec
from fedblend.core.training import Batch, LossTerm, TrainResult


@dataclass(frozen=True)
class FedPACOptions:
    """Defaults: the paper (lambda = 1, one classifier epoch, count-weighted centroids, QP combination); the
    alignment is averaged per feature entry as in the authors' code, whose lambda = 1 is "for mse_loss"."""

    CHOICES: ClassVar[dict] = {"combine": ("qp", "local"), "centroids": ("counts", "mean"),
                               "align_norm": ("sum", "mean")}
    RANGES: ClassVar[dict] = {"lam": ">= 0", "head_epochs": "[0, 10000]", "head_lr": ">= 0", "weight_eps": "[0, 1)"}

    lam: float = opt(1.0, "lambda of the feature-alignment term (Eq. 5)")
    head_epochs: int = opt(1, "epochs of classifier training (body frozen) before the body epochs")
    head_lr: float = opt(0.0, "learning rate of the classifier epochs (0: the run's lr; authors' code: 0.1)")
    combine: str = opt("qp", '"qp": Eq. 10 classifier combination; "local": keep the own head (no collaboration)')
    centroids: str = opt("counts", '"counts": Eq. 6 weighted by class counts; "mean": plain mean (PFLlib)')
    align_norm: str = opt("mean", "\"mean\": per element (authors' code and PFLlib: MSELoss); \"sum\": squared norm (Eq. "
                                  "5)")
    weight_eps: float = opt(0.0, "zero out combination weights below this (authors' code: 1e-3), then renormalise")


# ------------------------------------------------------------------------------------------------ pure parts
def alignment_loss(params: Params, batch: Batch, centroids: torch.Tensor, has: torch.Tensor, lam: float,
                   per_element: bool) -> torch.Tensor:
    """Eq. 5: ``lambda * 1/B sum_b ||f(x_b) - c_{y_b}||^2`` over samples whose class has a global centroid."""
    diff = (batch.features - centroids[batch.y]) * has[batch.y].unsqueeze(1).to(batch.features.dtype)
    sq = (diff ** 2).sum(1)
    if per_element:
        sq = sq / batch.features.shape[1]
    return lam * sq.mean()


def class_sums(values: torch.Tensor, y: torch.Tensor, num_classes: int, product: bool | None = None) -> torch.Tensor:
    """Per class, the sum of the rows of ``values`` (``(n, ...)``) labelled with it: ``index_add_`` on the CPU
    (one pass, in sample order); on a GPU, where ``index_add_`` adds with atomics in a varying order, a one-hot
    matrix product, so that two runs there give the same bits (``product`` forces one or the other)."""
    if not (values.device.type != "cpu" if product is None else product):
        out = torch.zeros((num_classes,) + tuple(values.shape[1:]), dtype=values.dtype, device=values.device)
        return out.index_add_(0, y, values)
    onehot = torch.nn.functional.one_hot(y, num_classes).to(values.dtype)
    return (onehot.T @ values.reshape(len(y), -1)).reshape((num_classes,) + tuple(values.shape[1:]))


@torch.no_grad()
def feature_statistics(model, params: Params, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                       batch_size: int = 1024) -> dict[str, torch.Tensor]:
    """Per-class counts, class means ``mu_k`` (zeros where absent), ``h_k = p(k) mu_k`` and ``V`` (Sec. 4.3)."""
    feats = features_of(model, params, x, batch_size).double()
    counts = torch.bincount(y, minlength=num_classes).double()
    sums = class_sums(feats, y, num_classes)
    sq = class_sums((feats ** 2).sum(1), y, num_classes)
    n = max(len(y), 1)
    p = counts / n
    mu = sums / counts.clamp_min(1).unsqueeze(1)
    second = sq / counts.clamp_min(1)  # tr(E[f f^T | k])
    v = (p * second).sum() - (p ** 2 * (mu ** 2).sum(1)).sum()
    return {"counts": counts, "mu": mu.float(), "h": (p.unsqueeze(1) * mu).float(), "V": (v / n).reshape(1).float()}


def qp_matrix(i: int, variances: torch.Tensor, hs: torch.Tensor) -> torch.Tensor:
    """``diag(V) + D_i`` with ``D_i[j1, j2] = sum_k <h_ik - h_j1k, h_ik - h_j2k>`` (``hs``: uploaders x C x d)."""
    g = (hs[i].unsqueeze(0) - hs).reshape(hs.shape[0], -1).double()  # row j: h_i - h_j, flattened over classes
    return torch.diag(variances.double()) + g @ g.T


def solve_simplex_qp(p_matrix: torch.Tensor) -> torch.Tensor:
    """``argmin_{alpha >= 0, sum alpha = 1} alpha^T P alpha`` with SciPy's SLSQP (P made symmetric, negative
    eigenvalues from round-off clipped to 0)."""
    try:
        import numpy as np
        from scipy.optimize import minimize
    except ImportError as e:  # pragma: no cover
        raise ImportError("FedPAC's classifier combination needs scipy (pip install scipy)") from e
    p = p_matrix.double().cpu()
    p = 0.5 * (p + p.T)
    evals, evecs = torch.linalg.eigh(p)
    if float(evals.min()) < 0:
        p = evecs @ torch.diag(evals.clamp_min(0)) @ evecs.T
    pm = p.numpy()
    m = pm.shape[0]
    scale = max(float(np.abs(pm).max()), 1e-12)  # conditioning only: the minimiser does not depend on the scale
    pm = pm / scale
    res = minimize(lambda a: float(a @ pm @ a), np.full(m, 1.0 / m), jac=lambda a: 2 * pm @ a, method="SLSQP",
                   bounds=[(0.0, 1.0)] * m, constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0,
                                                          "jac": lambda a: np.ones_like(a)}],
                   options={"ftol": 1e-12, "maxiter": 500})
    a = torch.as_tensor(res.x, dtype=torch.float64).clamp_min(0)
    return a / a.sum()


def combination_weights(variances: torch.Tensor, hs: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Row ``i``: client ``i``'s classifier-combination weights over the uploaders (Eq. 10)."""
    rows = []
    for i in range(hs.shape[0]):
        a = solve_simplex_qp(qp_matrix(i, variances, hs))
        if eps:
            a = torch.where(a < eps, torch.zeros_like(a), a)
            a = a / a.sum() if float(a.sum()) > 0 else torch.nn.functional.one_hot(torch.tensor(i), len(a)).double()
        rows.append(a)
    return torch.stack(rows)


def aggregate_centroids(protos: Sequence[torch.Tensor], counts: Sequence[torch.Tensor], rule: str
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 6: ``c_k = sum_i n_ik c_ik / sum_i n_ik`` (``"mean"``: over the clients holding class ``k``); and
    which classes have a centroid."""
    c = torch.stack([cnt.double() for cnt in counts])  # clients x C
    w = c if rule == "counts" else (c > 0).double()
    tot = w.sum(0)
    cent = (w.unsqueeze(2) * torch.stack([p.double() for p in protos])).sum(0) / tot.clamp_min(1e-12).unsqueeze(1)
    return cent.float(), tot > 0


# ------------------------------------------------------------------------------------------------ the method
@register_method
class FedPAC(Method):
    name = "fedpac"
    display_name = "FedPAC"
    options_cls = FedPACOptions
    paper = ("Xu, Tong, Huang, Personalized Federated Learning with Feature Alignment and Classifier "
             "Collaboration (FedPAC), ICLR 2023")

    def declare(self, choice: str) -> Traits:
        """Global body + own combined head, its next round's start (PFLlib evaluates there)."""
        return Traits(evaluates_received_model=True)

    def eval_models(self) -> dict[str, str]:
        return {"received": "the global feature extractor with the client's personalized classifier (the server's "
                            "Eq. 10 combination from its last round, else its own head)"}

    def head_names(self, run: RunInfo) -> list[str]:
        return run.model.head_names()

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        return {**super().init_server(sctx), "heads": {}, "centroids": None, "has": None}

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """Global body + the client's combined head (if the server has one) + the global centroids."""
        msg = Message({"params": select(server["global"], sctx.run.model.body_names())})
        if cid in server["heads"]:
            msg.arrays["params"].update(server["heads"][cid])
        if server["centroids"] is not None:
            msg.arrays["fedpac"] = {"centroids": server["centroids"], "has": server["has"]}
        return msg

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        cids = sorted(replies)
        sizes = [replies[c].metrics["num_samples"] for c in cids]
        heads = [select(replies[c].params(), self.head_names(sctx.run)) for c in cids]
        glob = {**server["global"], **weighted_average([replies[c].params() for c in cids], sizes)}
        stats = [replies[c].params("fedpac") for c in cids]
        cent, has = aggregate_centroids([s["protos"] for s in stats], [s["counts"] for s in stats],
                                        self.opts.centroids)
        new_heads = dict(server["heads"])
        if self.opts.combine == "qp":
            alpha = combination_weights(torch.cat([s["V"] for s in stats]), torch.stack([s["h"] for s in stats]),
                                        self.opts.weight_eps)
            for r, c in enumerate(cids):
                new_heads[c] = weighted_average(heads, alpha[r].tolist())
            sctx.stats["fedpac_self_weight"] = float(alpha.diagonal().mean())
        else:
            new_heads.update({c: h for c, h in zip(cids, heads)})
        return {**server, "global": glob, "heads": new_heads, "centroids": cent, "has": has}

    # ------------------------------------------------------------------------------------------ client
    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """Statistics of the model trained from, classifier epoch(s), then body epochs with the alignment term."""
        before = feature_statistics(ctx.model, params, ctx.data.train_x, ctx.data.train_y, num_classes(ctx.run))
        head, body = self.head_names(ctx.run), ctx.run.model.body_names()
        if self.opts.head_epochs:
            res = yield train_spec(self, params, msg, cstate, ctx, trainable=head, epochs=self.opts.head_epochs,
                                        lr=self.opts.head_lr or None, loss_terms=(), stream="head_batches")
            cstate = record_training(res, cstate, ctx)
            params = res.params
        res = yield train_spec(self, params, msg, cstate, ctx, trainable=body)
        res.extras["before"] = before
        return res, record_training(res, cstate, ctx)

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """Body and head, ``V_i`` and ``h_i`` of the model trained from, class centroids of the trained model."""
        before = res.extras["before"]
        after = feature_statistics(ctx.model, res.params, ctx.data.train_x, ctx.data.train_y, num_classes(ctx.run))
        reply = super().reply(res, msg, cstate, ctx)
        reply.arrays["fedpac"] = {"V": before["V"], "h": before["h"], "protos": after["mu"],
                                  "counts": after["counts"].float()}
        return reply

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        rec = msg.params("fedpac")
        if not rec or not self.opts.lam:
            return ()
        return (LossTerm(alignment_loss, {"centroids": rec["centroids"].detach(), "has": rec["has"],
                                          "lam": self.opts.lam, "per_element": self.opts.align_norm == "mean"},
                         needs_features=True, name="fedpac_align"),)

