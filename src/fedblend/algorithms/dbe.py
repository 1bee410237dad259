"""DBE (Zhang et al., "Eliminating Domain Bias for Federated Learning in Representation Space", NeurIPS 2023),
the authors' FedAvg+DBE ("FedDBE").

DBE splits a client's representation into a global part and a personalized part:

* **PRBM** (personalized representation bias memory, paper Sec. 4.2): ``z_i = f(x; theta^f) + zbar_i^p``; the
  bias vector ``zbar_i^p`` (one entry per feature, initialised to zeros) is trained jointly with the model and
  never leaves the client; the head sees the shifted feature ``h(z_i)``.
* **MR** (mean regularisation, Sec. 4.3): ``L_i = CE(h(f(x) + zbar_i^p), y) + kappa * R_i`` with
  ``R_i = 1/(2K) ||zbar_i^g - zbar^g||^2`` (``K`` = feature dimension; the authors' code
  ``mean(0.5 * (zbar_i^g - zbar^g)^2)``), ``zbar_i^g`` the client's mean global feature ``E f(x)`` and ``zbar^g``
  the global mean ``sum_i n_i zbar_i^g / sum_i n_i``, collected once in an initialisation period.

Everything else is FedAvg: the whole model (body and head, without the bias) travels both ways and the server
averages it by data size; the reported global model is that average, the personalized model is the received
global model with the client's own ``zbar_i^p`` (``[eval] model = "received"``; ``"trained"``: the client's model
after its last local training with its bias), evaluated through PRBM's forward ``h(f(x) + zbar_i^p)``, the one
local training uses (an :class:`~fedblend.core.evaluation.EvalSpec`; PFLlib: ``head(base(x) + client_mean)``).

Choices where paper and code are silent or differ (``docs/methods/dbe.md``):

* Initialisation period: the authors' code (and PFLlib's FedDBE) trains every client once without DBE before round
  1 only to get the client means, then discards that training. Here, by default, the first round is that period
  (``init_pass = "round1"``, ``global_mean = "first"``): its clients train plain FedAvg and report ``zbar_i^g``
  over their training data after training; the server fixes ``zbar^g`` from them and sends it from then on.
  ``init_pass = "before"`` reproduces the code: round 1 opens with an extra exchange (phase ``"dbe_init"``) in
  which the round's clients train once from the received global model without DBE and reply only ``zbar_i^g``
  (the training is discarded; their states do not change), so every round, the first included, trains with the
  bias and the regulariser. ``global_mean = "every"`` refreshes ``zbar^g`` from every round's replies.
* ``zbar_i^g`` in the regulariser: the authors' code keeps an exponential running mean of the batch means (its
  FMNIST script sets momentum 1, i.e. the current batch mean); a loss term here is stateless, so it is the
  current batch mean (= that script).
* The bias is trained by the client optimiser (with its momentum); the code uses a separate plain SGD at the same
  learning rate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch.func import functional_call

from fedblend.algorithms.parts.features import feature_mean
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, weighted_average
from fedblend.core.evaluation import EvalSpec
from fedblend.core.method import ClientCtx, ClientWork, Message, Method, ServerCtx, State, Traits
from fedblend.core.template import record_training, train_spec
from fedblend.core.training import Batch, Forward, LossTerm, TrainResult
from fedblend.models.zoo import FedModel

INIT = "dbe_init"  # the phase of the initialisation pass (``init_pass = "before"``)
PRBM = "dbe.prbm"  # the bias vector's name inside a training spec's parameters (not a model parameter)


@dataclass(frozen=True)
class DBEOptions:
    """Defaults: the paper; ``kappa`` from the authors' FMNIST script (``-klw 50``)."""

    CHOICES: ClassVar[dict] = {"global_mean": ("first", "every"), "init_pass": ("round1", "before")}
    RANGES: ClassVar[dict] = {"kappa": ">= 0"}

    kappa: float = opt(50.0, "weight of the mean regularisation (MR)")
    prbm: bool = opt(True, "the personalized representation bias (False: no bias, MR alone)")
    global_mean: str = opt("first", '"first": fixed after the first round (init period); "every": refreshed each round')
    init_pass: str = opt("round1", '"round1": round 1 is the initialisation period (plain FedAvg training gives '
                         'zbar^g); "before": round 1 opens with a discarded plain training pass of its clients '
                         'that only yields zbar^g (the authors\' code / PFLlib), so every round trains with DBE')


# ------------------------------------------------------------------------------------------------ pure parts
def mean_regulariser(params: Params, batch: Batch, global_mean: torch.Tensor, kappa: float) -> torch.Tensor:
    """MR (Sec. 4.3): ``kappa * 1/(2K) ||zbar_i^g - zbar^g||^2`` with ``zbar_i^g`` the batch mean of ``f(x)``."""
    return kappa * 0.5 * ((batch.features.mean(0) - global_mean) ** 2).mean()


def mr_term(global_mean: torch.Tensor, kappa: float) -> LossTerm:
    return LossTerm(mean_regulariser, {"global_mean": global_mean.detach(), "kappa": kappa}, needs_features=True,
                    name="dbe_mr")


def shifted_forward(model: FedModel, params: Params, x: torch.Tensor, with_features: bool, key: str):
    """PRBM's forward in training (Sec. 4.2): ``h(f(x) + zbar_i^p)`` with the bias the entry ``key`` of the trained
    ``params`` (not a model parameter, trained by the same step); the features returned (for MR) are ``f(x)``."""
    model_params = {k: v for k, v in params.items() if k != key}
    feats = functional_call(model, model_params, (x,), {"part": "features"})
    return functional_call(model, model_params, (feats + params[key],), {"part": "head"}), feats


def prbm_forward() -> Forward:
    """PRBM's forward, ``h(f(x) + zbar_i^p)`` with the bias the entry :data:`PRBM` of the parameters: what local
    training runs and what the personalized model is evaluated with."""
    return Forward(shifted_forward, {"key": PRBM}, name="dbe_prbm")


# ------------------------------------------------------------------------------------------------ the method
@register_method
class DBE(Method):
    name = "dbe"
    display_name = "DBE"
    options_cls = DBEOptions
    paper = ("Zhang et al., Eliminating Domain Bias for Federated Learning in Representation Space (DBE), "
             "NeurIPS 2023")

    def eval_models(self) -> dict[str, str]:
        return {"received": "the received global model with the client's own representation bias zbar_i^p (PRBM) "
                            "added to its features",
                "trained": "the client's model after its last local training with its representation bias zbar_i^p "
                           "(PRBM) added to its features (its current local model, as FedAPA's evaluation loop "
                           "scores clients)"}

    def declare(self, choice: str) -> Traits:
        """The received global model is evaluated (the bias is added in evaluate, after any transform) and the
        client keeps no model; ``[eval] model = "trained"``: the client keeps its trained model and that model
        (with its bias) is evaluated."""
        trained = choice == "trained"
        return Traits(keeps_model=trained, evaluates_received_model=not trained)

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """``"trained"``: the last trained model (the received one until the client first trains)."""
        if self.traits.eval_choice == "trained" and cstate.get("trained"):
            return cstate["params"]
        return self.client_init(msg, cstate, ctx)

    # ------------------------------------------------------------------------------------------ server
    def phases(self, sctx: ServerCtx) -> Sequence[str]:
        """Round 1 opens with the initialisation pass under ``init_pass = "before"``."""
        return (INIT, "train") if self.opts.init_pass == "before" and sctx.rnd == 0 else ("train",)

    def init_server(self, sctx: ServerCtx) -> State:
        return {**super().init_server(sctx), "global_mean": None}

    def configure(self, phase: str, server: State, cid: int, sctx: ServerCtx) -> Message:
        if phase == INIT:  # the global model, without a global mean (the clients train plain FedAvg)
            return super().configure_train(server, cid, sctx)
        return super().configure(phase, server, cid, sctx)

    def aggregate(self, phase: str, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        if phase == INIT:  # only zbar^g; the global model is not touched
            return {**server, "global_mean": self._global_mean(replies)}
        return super().aggregate(phase, server, replies, sctx)

    @staticmethod
    def _global_mean(replies: Mapping[int, Message]) -> torch.Tensor:
        """``zbar^g = sum_i n_i zbar_i^g / sum_i n_i`` over the replies."""
        cids = sorted(replies)
        means = [{"m": replies[c].params("dbe")["client_mean"]} for c in cids]
        return weighted_average(means, [replies[c].metrics["num_samples"] for c in cids])["m"]

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        msg = super().configure_train(server, cid, sctx)
        if server["global_mean"] is not None:
            msg.arrays["dbe"] = {"global_mean": server["global_mean"]}
        return msg

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """FedAvg of the models; ``zbar^g = sum_i n_i zbar_i^g / sum_i n_i`` (first round, or every round)."""
        out = super().aggregate_train(server, replies, sctx)
        if server["global_mean"] is None or self.opts.global_mean == "every":
            out["global_mean"] = self._global_mean(replies)
        return out

    # ------------------------------------------------------------------------------------------ client
    def client_step(self, phase: str, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        if phase == INIT:
            return self.client_init_pass(msg, cstate, ctx)
        return super().client_step(phase, msg, cstate, ctx)

    def client_init_pass(self, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        """``init_pass = "before"``: plain local training from the received model (no bias, no regulariser) and
        ``zbar_i^g`` of the trained model over the training split; the training is discarded (state unchanged)."""
        params = self.client_init(msg, cstate, ctx)
        res = yield train_spec(self, params, msg, cstate, ctx)
        mean = feature_mean(ctx.model, res.params, ctx.data.train_x)
        return Message({"dbe": {"client_mean": mean}}, {"num_samples": ctx.data.num_train}), cstate

    def init_client(self, ctx: ClientCtx) -> State:
        state = super().init_client(ctx)
        if self.opts.prbm:
            dim = feature_mean(ctx.model, ctx.run.init_params, ctx.data.train_x[:1]).numel()
            state["prbm"] = torch.zeros(dim, device=ctx.run.device)
        return state

    @staticmethod
    def _active(msg: Message) -> bool:
        """DBE's forward and loss apply once the global mean is known (after the initialisation period)."""
        return msg.params("dbe").get("global_mean") is not None

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """One spec with DBE's forward pass: the bias is a trained entry of the spec, added to the features
        before the head; the result's ``params`` are the model without it (the bias goes to the state)."""
        spec = train_spec(self, params, msg, cstate, ctx)
        if self._active(msg) and self.opts.prbm:
            spec.params = {**params, PRBM: cstate["prbm"]}
            spec.forward = prbm_forward()
        res = yield spec
        if PRBM in res.params:
            cstate = {**cstate, "prbm": res.params[PRBM]}
        cstate = record_training(res, cstate, ctx)
        if self.traits.eval_choice == "trained":
            cstate = {**cstate, "trained": True}
        trained = {k: v for k, v in res.params.items() if k != PRBM}
        return TrainResult(trained, res.momentum, res.mean_loss, res.steps, res.samples), cstate

    def scored_params(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx) -> Params | EvalSpec:
        return self._personal(params, cstate, self._active(msg))

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """FedAvg's reply and ``zbar_i^g``, the client's mean feature under the trained model."""
        reply = super().reply(res, msg, cstate, ctx)
        reply.arrays["dbe"] = {"client_mean": feature_mean(ctx.model, res.params, ctx.data.train_x)}
        return reply

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        gmean = msg.params("dbe").get("global_mean")
        return (mr_term(gmean, self.opts.kappa),) if gmean is not None and self.opts.kappa else ()

    def _personal(self, params: Params, cstate: State, active: bool = True) -> EvalSpec:
        """``params`` with the client's bias ``zbar_i^p``, through PRBM's forward (no bias yet: the model's own)."""
        if not (active and self.opts.prbm and "prbm" in cstate):
            return EvalSpec(params)
        return EvalSpec({**params, PRBM: cstate["prbm"]}, prbm_forward())

    def evaluate(self, msg: Message, cstate: State, ctx: ClientCtx) -> EvalSpec:
        """The model ``[eval] model`` names (after transforms, e.g. ALA's blend) with the client's bias
        ``zbar_i^p`` (PFLlib's ``head(base(x) + client_mean)``)."""
        return self._personal(self.eval_params(msg, cstate, ctx), cstate)
