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

Validation data (Eq. 6-7: ``L_i`` is client ``i``'s loss on its own *validation* data, which it does not train
on): ``val_split = "val"`` uses the run's validation split when it has one (``partition.split =
"train_val_test"``); otherwise the client holds out ``holdout`` (0.2) of its own training split as its validation
data and trains on the rest, as the authors' code (``--train_split 0.8``, a seeded ``random_split`` of the local
data) and the references (PFLlib ``val_ratio = 0.2``, FL-bench ``valset_ratio = 0.2``) do. The held-out samples are
drawn once per run and client from the seed tree (stream ``("fedfomo-holdout", cid)`` of the run's seed, from
the client's own sample count only): ``holdout_pick = "random"`` (authors' code), or ``"last"``: the last
``floor(holdout * n)`` samples in the client's data order (PFLlib's ``train_data[-int(0.2 n):]``). ``holdout = 0``
or ``val_split = "train"``: the weights are computed on the training split, which the client also trains on
(fedblend's behaviour before the hold-out existed).

Choices where the paper is silent (options): ``epsilon`` and its linear per-round decay ``epsilon_decay``
(exploration rate of the epsilon-greedy selection); ``candidates``: ``"stored"`` (every client whose model the
server holds, paper Sec. 3.2: the server keeps the latest model of each client) or ``"last_round"`` (only the
previous round's uploads, PFLlib).

PFLlib's FedFomo (``clientfomo.py`` / ``serverfomo.py`` at d832e76) departs from Eq. 5-7 three times, each an
option whose default is the paper: ``baseline = "before_training"`` scores ``L_i`` and measures the distances
from the client's model *before* its last local training (PFLlib's ``old_model``, cloned after the previous
round's mixing; the paper: the client's current model ``theta_i``); ``include_self`` makes the client's own
stored upload a candidate and starts ``P`` at the identity (PFLlib's ``P = eye``, so the client's own trained
model is always among its top-M and, against that baseline, weighted whenever training lowered the validation
loss); ``affinity = "raw"`` adds the unnormalised, possibly negative ``(L_i(base) - L_i(theta_n)) / ||theta_n -
base||`` to ``P`` (PFLlib's ``weight_vector``) instead of Eq. 7's weights. The update itself is Eq. 5 in every
case: ``sum_n w_n theta_n`` with the normalised weights, the client's model unchanged when none is positive.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedblend.algorithms.fedfomo.holdout import holdout_rows, holdout_view
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.common.rng import SeedTree
from fedblend.core.evaluation import evaluate_params
from fedblend.core.method import ClientCtx, Message, Method, ServerCtx, State, Traits
from fedblend.core.training import TrainResult
from fedblend.data.federated import ClientData


@dataclass(frozen=True)
class FedFomoOptions:
    CHOICES: ClassVar[dict] = {"val_split": ("val", "train"), "candidates": ("stored", "last_round"),
                               "holdout_pick": ("random", "last"), "baseline": ("current", "before_training"),
                               "affinity": ("weights", "raw")}
    RANGES: ClassVar[dict] = {"m": "[1, 100000]", "epsilon": "[0, 1]", "epsilon_decay": ">= 0", "holdout": "[0, 1)"}

    m: int = opt(5, "models downloaded per client and round (paper's M)")
    epsilon: float = opt(0.3, "epsilon-greedy exploration rate in the first round")
    epsilon_decay: float = opt(0.05, "subtracted from epsilon every round (floor 0)")
    val_split: str = opt("val", 'data the weights are computed on: "val" (the run\'s validation split, else the '
                                'hold-out) or "train"')
    holdout: float = opt(0.2, "share of the training split held out as validation data when the run has no "
                              "validation split (0: none, the weights are computed on the training split)")
    holdout_pick: str = opt("random", '"random": a seeded random hold-out (authors\' code); "last": the last '
                                      "samples in the client's data order (PFLlib)")
    candidates: str = opt("stored", "\"stored\": every stored model; \"last_round\": the previous round's uploads")
    baseline: str = opt("current", "the model L_i and the distances are taken from: \"current\" (the client's model, "
                                   "Eq. 6) or \"before_training\" (its model before its last local training: PFLlib)")
    include_self: bool = opt(False, "the client's own stored upload is a candidate and P starts at the identity "
                                    "(PFLlib); the paper: other clients' models only")
    affinity: str = opt("weights", "what P[i, n] grows by: Eq. 7's weights (\"weights\") or the unnormalised, "
                                   "possibly negative (L_i(base) - L_i(theta_n)) / distance (\"raw\": PFLlib)")


def raw_gains(own_loss: float, losses: Sequence[float], distances: Sequence[float]) -> torch.Tensor:
    """Eq. 6 before its ``max(., 0)``: ``(L(theta_i) - L(theta_n)) / ||theta_n - theta_i||``, 0 for a model at
    distance 0 (PFLlib's ``weight_vector``, which it adds to ``P`` as they are)."""
    return torch.tensor([(own_loss - lo) / d if d > 0 else 0.0 for lo, d in zip(losses, distances)],
                        dtype=torch.float64)


def fomo_weights(own_loss: float, losses: Sequence[float], distances: Sequence[float]) -> torch.Tensor:
    """Eq. 6-7: ``w_n = max(L(theta_i) - L(theta_n), 0) / ||theta_n - theta_i||``, normalised to sum 1 (all zero
    when no model improves on the client's own). A model at distance 0 gets weight 0."""
    w = raw_gains(own_loss, losses, distances).clamp(min=0.0)
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
    display_name = "FedFomo"
    options_cls = FedFomoOptions
    paper = ("Zhang et al., Personalized Federated Learning with First Order Model Optimization (FedFomo), "
             "ICLR 2021")

    def declare(self, choice: str) -> Traits:
        # a client evaluates its own model; whether each client moved toward others' models is kept per client
        return Traits(global_model=False, evaluates_own_model=True, client_stats=("fomo_moved",))

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's own model after its last local training (no global model)"}

    # ------------------------------------------------------------------------------------------ server
    def init_server(self, sctx: ServerCtx) -> State:
        n = sctx.run.num_clients
        start = torch.eye if self.opts.include_self else torch.zeros  # PFLlib: P = eye
        return {"models": {}, "last_round": [], "affinity": start(n, n, dtype=torch.float64)}

    def epsilon(self, rnd: int) -> float:
        return max(0.0, self.opts.epsilon - self.opts.epsilon_decay * rnd)

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """The ``M`` models chosen for client ``cid`` (records ``"m0"``, ``"m1"``, ...; ids in ``config``)."""
        pool = sorted(int(c) for c in server["models"]) if self.opts.candidates == "stored" else server["last_round"]
        ids = select_models(server["affinity"][cid], [c for c in pool if c != cid or self.opts.include_self], self.opts.m,
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
                affinity[cid, torch.tensor(ids)] += torch.tensor(w, dtype=torch.float64, device=affinity.device)
        return {**server, "models": models, "last_round": sorted(replies), "affinity": affinity}

    # ------------------------------------------------------------------------------------------ client
    def holds_out(self, data: ClientData) -> bool:
        """Whether the client holds out part of its training split (``val_split = "val"``, ``holdout > 0``, the
        run has no validation split, and ``floor(holdout * n) >= 1``)."""
        return (self.opts.val_split == "val" and self.opts.holdout > 0 and not len(data.val_y)
                and int(self.opts.holdout * data.num_train) >= 1)

    def before_training(self, msg: Message, cstate: State, ctx: ClientCtx) -> State:
        """The hold-out (Eq. 6-7: the client's validation data): for this exchange the client's data becomes its
        kept training rows (``train``, what the template trains on and ``num_samples`` counts) and its held-out
        rows (``val``, what :meth:`client_init` scores on). The rows depend only on the run's seed, the client's
        id and its own sample count, so they are the same every round and in every backend (each trains on
        ``ctx.data``); evaluation builds its own context from the client's full data, so the test split is
        untouched."""
        if self.holds_out(ctx.data):
            gen = SeedTree(ctx.run.seed).torch("fedfomo-holdout", ctx.cid)
            ctx.data = holdout_view(ctx.data, *holdout_rows(ctx.data.num_train, self.opts.holdout,
                                                            self.opts.holdout_pick, gen))
        return cstate

    def val_data(self, ctx: ClientCtx) -> tuple[torch.Tensor, torch.Tensor]:
        """``L_i``'s data: the validation split (the run's, or the hold-out :meth:`before_training` made) under
        ``val_split = "val"``, else (or with none) the training split."""
        d = ctx.data
        if self.opts.val_split == "val" and len(d.val_y):
            return d.val_x, d.val_y
        return d.train_x, d.train_y

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """Eq. 5-7 on the client's own model and the received ones (what ``P`` grows by kept for ``reply``): the
        losses and distances from the client's model (``baseline = "before_training"``: from its model before its
        last local training), the update from its model."""
        own = cstate["params"]
        base = cstate.get("fomo_start", own) if self.opts.baseline == "before_training" else own
        models = [msg.params(f"m{k}") for k in range(len(msg.config.get("ids", [])))]
        x, y = self.val_data(ctx)
        with torch.no_grad():
            mean_loss = [lo / max(n, 1) for _, lo, n in (evaluate_params(ctx.model, p, x, y) for p in [base] + models)]
        distances = [distance(m, base) for m in models]
        weights = fomo_weights(mean_loss[0], mean_loss[1:], distances)
        grows = raw_gains(mean_loss[0], mean_loss[1:], distances) if self.opts.affinity == "raw" else weights
        ctx.scratch["fomo_weights"] = grows.tolist()
        if models:  # the round's share of receiving clients whose model moves (some w_n > 0); the rest keep theirs
            ctx.stats["fomo_moved"] = float(bool((weights > 0).any()))
        return fomo_update(own, models, weights)

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """The template's training; with ``baseline = "before_training"`` the model it starts from is kept
        (``fomo_start``: PFLlib's ``old_model``, the next round's baseline)."""
        res, cstate = yield from super().local_training(params, msg, cstate, ctx)
        if self.opts.baseline == "before_training":
            cstate = {**cstate, "fomo_start": {n: t.detach().clone() for n, t in params.items()}}
        return res, cstate

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """The trained model and what ``P``'s row grows by for the received models (Eq. 7's weights, or with
        ``affinity = "raw"`` the unnormalised gains)."""
        reply = super().reply(res, msg, cstate, ctx)
        reply.metrics.update(fomo_ids=list(msg.config.get("ids", [])), fomo_weights=ctx.scratch["fomo_weights"])
        return reply
