"""Ditto (Li, Hu, Beirami and Smith, "Ditto: Fair and Robust Federated Learning Through Personalization",
ICML 2021).

Every client ``k`` solves two problems (paper Eq. 1-2 and Alg. 1):

* the global objective, as FedAvg does: from the received ``w^t`` it runs local SGD on its own loss ``F_k`` and
  returns the result ``w_k^t``; the server averages the ``w_k^t`` (Alg. 1 lines 4-5, 8; by data size here);
* its personalized model ``v_k`` (Eq. 2: ``min_v h_k(v; w*) = F_k(v) + lambda/2 ||v - w*||^2``), kept on the
  client across rounds and updated for ``s`` local iterations (Alg. 1 line 7)::

      v_k <- v_k - eta (grad F_k(v_k) + lambda (v_k - w^t))

  i.e. SGD on ``F_k`` plus FedProx's proximal term anchored at the received ``w^t``
  (:func:`fedblend.algorithms.parts.proximal.proximal_term`).

``v_k`` starts at the initial model ``w^0`` (Alg. 1 input) and lives in the client state (``cstate["personal"]``,
with its own momentum buffers ``cstate["personal_momentum"]`` under ``optimizer_state = "keep"``). Evaluation
uses ``v_k`` (paper Sec. 4: "we evaluate the personalized models"); the global model is reported beside it.

Choices where the paper is silent: ``personal_epochs`` (None: ``[train] epochs``; the paper runs the same number
of local iterations for both problems in its experiments), the order of the two updates (the paper's Alg. 1:
global first, then personal), and the batches: the personalized update draws from the client's ``"batches"``
stream (so ``lam = 0`` trains ``v_k`` exactly as ``local`` trains its model), the global update from
``"global"``. ``lam`` has no single default in the paper (tuned per dataset from a grid that includes 0.1);
default 0.1.

With ``+ala``, ALA initialises the global-objective update (the model Ditto downloads) from the received ``w^t``
and the client's last ``w_k``, as it does for FedAvg; the personalized ``v_k`` is still what is evaluated, and
the proximal term still pulls toward the received ``w^t``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from fedblend.algorithms.parts.proximal import proximal_term
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params, clone
from fedblend.core.method import ClientCtx, Message, Method, State, Traits, report_loss
from fedblend.core.template import record_training, train_spec
from fedblend.core.training import TrainSpec, merge_momentum


@dataclass(frozen=True)
class DittoOptions:
    # personal_epochs = 0 would never train v_k, the model Ditto evaluates: refused, not run as if fine
    RANGES: ClassVar[dict] = {"lam": ">= 0", "personal_epochs": "[1, 10000]"}
    lam: float = opt(0.1, "lambda of Eq. 2: pull of v_k toward the global model (paper: tuned per dataset)")
    personal_epochs: int | None = opt(None, "epochs of the v_k update per round (None: [train] epochs)")


@register_method
class Ditto(Method):
    name = "ditto"
    display_name = "Ditto"
    options_cls = DittoOptions
    paper = "Li, Hu, Beirami and Smith, Ditto: Fair and Robust Federated Learning Through Personalization, ICML 2021"

    def declare(self, choice: str) -> Traits:
        """The global copy restarts from w^t every round (v_k is kept under "personal"); v_k is evaluated also
        with a transform on: the transform changes the global update only."""
        return replace(super().declare(choice), keeps_model=False, eval_transforms=False)

    def eval_models(self) -> dict[str, str]:
        return {"trained": "each client's personalized model v_k (Ditto Eq. 2) after its last local update"}

    def init_client(self, ctx: ClientCtx) -> State:
        return {**super().init_client(ctx), "personal": clone(ctx.run.init_params)}

    def personal_spec(self, msg: Message, cstate: State, ctx: ClientCtx) -> TrainSpec:
        """Alg. 1 line 7: SGD on ``F_k(v) + lam/2 ||v - w^t||^2`` from the kept ``v_k``."""
        keep = ctx.train.optimizer_state == "keep"
        terms = (proximal_term(msg.params(), self.opts.lam),) if self.opts.lam else ()
        return TrainSpec(params=cstate["personal"], epochs=self.opts.personal_epochs, loss_terms=terms,
                         momentum=cstate.get("personal_momentum") if keep else None)

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """The global update (FedAvg's, reported as ``train_loss``), then the personalized one
        (``personal_loss``); the reply carries the global update's result. The global-objective update (Alg. 1
        line 5) draws its batches from the ``"global"`` stream."""
        res = yield train_spec(self, params, msg, cstate, ctx, stream="global")
        cstate = record_training(res, cstate, ctx)
        per = yield self.personal_spec(msg, cstate, ctx)
        cstate = {**cstate, "personal": per.params}
        if ctx.train.optimizer_state == "keep" and per.momentum is not None:
            cstate["personal_momentum"] = merge_momentum(cstate.get("personal_momentum"), per.momentum)
        report_loss(ctx, "personal_loss", per)
        return res, cstate

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        return cstate["personal"]

