"""FedFomo (Zhang, Sapra, Fidler, Yeung, Alvarez, "Personalized Federated Learning with First Order Model
Optimization", ICLR 2021).

There is no global model. The server stores every client's most recent upload ``theta_j`` and an affinity
matrix ``P`` (``N x N``; row ``i``: how much client ``i`` has gained from each other client's model). Each round
(paper Sec. 3, Algorithm 1), for every selected client ``i``:

* the server sends ``M`` stored models of *other* clients (Sec. 3.2): the ``M`` with the highest affinity
  ``P[i, .]``, or, with probability ``epsilon`` (epsilon-greedy exploration, decaying over rounds),
  ``M`` chosen uniformly at random; before any upload there is nothing to send;
* the client scores its current model ``theta_i`` and each received ``theta_n`` on its validation data
  (``L_i(.)``) and weights them by the first-order approximation of the optimal combination (Eq. 6-7)::

      w_n = max(L_i(theta_i) - L_i(theta_n), 0) / ||theta_n - theta_i||,     w_n <- w_n / sum_m w_m

  and updates ``theta_i <- theta_i + sum_n w_n (theta_n - theta_i)`` (Eq. 5; all ``w_n = 0``: ``theta_i`` stays);
* it trains ``theta_i`` locally (the run's local SGD) and uploads it with the ``w_n``; the server stores it and
  adds the weights to its affinity row: ``P[i, n] += w_n`` (Sec. 3.2).

Bytes down are honest: a client receives ``M`` full models (``comm_bytes`` counts every record). Evaluation:
each client's own model after its last local training. FedFomo has no global model, so ``+ala`` does not apply.

Choices where the paper is silent (options): ``epsilon`` and its linear per-round decay ``epsilon_decay``
(exploration rate of the epsilon-greedy selection); the validation data (``val_split = "val"``: the client's
validation split, falling back to its training split when the run's split has none; ``"train"``: always the
training split); ``candidates``: ``"stored"`` (every client whose model the server holds, paper Sec. 3.2: the
server keeps the latest model of each client) or ``"last_round"`` (only the previous round's uploads, PFLlib).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.evaluation import evaluate_params
from fedblend.core.method import ClientCtx, Message, Method, ServerCtx, State
from fedblend.core.training import TrainResult


@dataclass(frozen=True)
class FedFomoOptions:
    CHOICES: ClassVar[dict] = {"val_split": ("val", "train"), "candidates": ("stored", "last_round")}
    RANGES: ClassVar[dict] = {"m": "[1, 100000]", "epsilon": "[0, 1]", "epsilon_decay": ">= 0"}

    m: int = opt(5, "models downloaded per client and round (paper's M)")
    epsilon: float = opt(0.3, "epsilon-greedy exploration rate in the first round")
    epsilon_decay: float = opt(0.05, "subtracted from epsilon every round (floor 0)")
    val_split: str = opt("val", 'data the weights are computed on: "val" (fallback train) or "train"')
    candidates: str = opt("stored", "\"stored\": every stored model; \"last_round\": the previous round's uploads")


def fomo_weights(own_loss: float, losses: Sequence[float], distances: Sequence[float]) -> torch.Tensor:
    """Eq. 6-7: ``w_n = max(L(theta_i) - L(theta_n), 0) / ||theta_n - theta_i||``, normalised to sum 1 (all zero
    when no model improves on the client's own). A model at distance 0 gets weight 0."""
    w = torch.tensor([max(own_loss - lo, 0.0) / d if d > 0 else 0.0 for lo, d in zip(losses, distances)],
                     dtype=torch.float64)
    total = float(w.sum())
    return w / total if total > 0 else w


def fomo_update(own: Mapping[str, torch.Tensor], models: Sequence[Mapping[str, torch.Tensor]],
                weights: torch.Tensor) -> Params:
    """Eq. 5: ``theta_i + sum_n w_n (theta_n - theta_i)``."""
    out = {}
    for k, v in own.items():
        delta = sum(float(w) * (m[k] - v) for w, m in zip(weights, models))
        out[k] = v + delta if len(models) else v.clone()
    return out


def distance(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """``||a - b||`` over all tensors."""
    return float(torch.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a)))


def select_models(affinity: torch.Tensor, candidates: Sequence[int], m: int, epsilon: float,
                  generator: torch.Generator) -> list[int]:
    """Sec. 3.2: the top-``m`` candidates by affinity (ties: lower id first), or with probability ``epsilon``
    ``m`` candidates uniformly at random. Returns client ids in ascending order."""
    cands = list(candidates)
    m = min(m, len(cands))
    if m == 0:
        return []
    if float(torch.rand((), generator=generator, dtype=torch.float64)) < epsilon:
        pick = torch.randperm(len(cands), generator=generator)[:m].tolist()
        return sorted(cands[i] for i in pick)
    scores = affinity[cands].tolist()
    order = sorted(range(len(cands)), key=lambda i: (-scores[i], cands[i]))
    return sorted(cands[i] for i in order[:m])


@register_method
class FedFomo(Method):
    name = "fedfomo"
    options_cls = FedFomoOptions
    paper = ("Zhang et al., Personalized Federated Learning with First Order Model Optimization (FedFomo), "
             "ICLR 2021")
    eval_model = "each client's own model after its last local training (no global model)"
    evaluates_own_model = True  # a client evaluates its own model
    has_global = False

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        n = sctx.run.num_clients
        return {"models": {}, "last_round": [], "affinity": torch.zeros(n, n, dtype=torch.float64)}

    def epsilon(self, rnd: int) -> float:
        return max(0.0, self.opts.epsilon - self.opts.epsilon_decay * rnd)

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """The ``M`` models chosen for client ``cid`` (records ``"m0"``, ``"m1"``, ...; ids in ``config``)."""
        pool = sorted(int(c) for c in server["models"]) if self.opts.candidates == "stored" else server["last_round"]
        ids = select_models(server["affinity"][cid], [c for c in pool if c != cid], self.opts.m,
                            self.epsilon(sctx.rnd), sctx.tree.torch("fomo-select", cid))
        return Message({f"m{k}": server["models"][str(c)] for k, c in enumerate(ids)}, config={"ids": ids})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """Store every upload; add each client's weights to its affinity row."""
        models = dict(server["models"])
        affinity = server["affinity"].clone()
        for cid in sorted(replies):
            models[str(cid)] = replies[cid].params()
            ids, w = replies[cid].metrics["fomo_ids"], replies[cid].metrics["fomo_weights"]
            if ids:
                affinity[cid, torch.tensor(ids)] += torch.tensor(w, dtype=torch.float64)
        return {**server, "models": models, "last_round": sorted(replies), "affinity": affinity}

    # ------------------------------------------------------------------------------------------ client
    def val_data(self, ctx: ClientCtx) -> tuple[torch.Tensor, torch.Tensor]:
        d = ctx.data
        if self.opts.val_split == "val" and len(d.val_y):
            return d.val_x, d.val_y
        return d.train_x, d.train_y

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """Eq. 5-7 on the client's own model and the received ones (their weights kept for ``reply``)."""
        own = cstate["params"]
        models = [msg.params(f"m{k}") for k in range(len(msg.config.get("ids", [])))]
        x, y = self.val_data(ctx)
        with torch.no_grad():
            mean_loss = [lo / max(n, 1) for _, lo, n in (evaluate_params(ctx.model, p, x, y) for p in [own] + models)]
        weights = fomo_weights(mean_loss[0], mean_loss[1:], [distance(m, own) for m in models])
        ctx.scratch["fomo_weights"] = weights.tolist()
        return fomo_update(own, models, weights)

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """The trained model and the weights ``client_init`` gave the received models (Eq. 7's affinity)."""
        reply = super().reply(res, msg, cstate, ctx)
        reply.metrics.update(fomo_ids=list(msg.config.get("ids", [])), fomo_weights=ctx.scratch["fomo_weights"])
        return reply
