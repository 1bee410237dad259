"""FedRep (Collins et al., "Exploiting Shared Representations for Personalized Federated Learning", ICML 2021).

The model is a shared representation ``phi`` (the body, ``model.body_names()``) and a local head ``h_i``
(``model.head_layers``). Per round (paper Alg. 1, Eq. 2-4):

* the server sends the current representation ``phi^t`` to every selected client;
* client ``i`` first updates its head for ``tau_h`` epochs with ``phi^t`` fixed (Alg. 1 line 6, Eq. 3:
  ``h_i <- GRD(f_i(h_i, phi^t), h_i, alpha)``), then its representation for ``tau`` epochs with the new head
  fixed (line 7, Eq. 4: ``phi_i <- GRD(f_i(h_i^{t+1}, phi), phi, alpha)``);
* it uploads ``phi_i`` only; the server averages the representations (line 10; by data size here, as every
  fedblend method aggregates -- the paper's Alg. 1 writes the plain mean over the selected clients, which equals
  it when data sizes are equal).

The paper's experiments use many head epochs and few representation epochs (Sec. 5: 10 epochs for the head, 1
for the representation): ``head_epochs = 10``; ``body_epochs`` (None) takes ``[train] epochs``. Each phase is a
:class:`~fedblend.core.training.TrainSpec` that names the tensors it trains; with ``optimizer_state = "keep"``
both halves keep their momentum buffers across phases and rounds (merged after each phase). The head phase
draws its batches from its own stream (``"head"``), the body phase from ``"batches"``.

Evaluation: as FedPer, the received representation with the client's own head after its last training; no
global model is reported (heads are never aggregated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from fedblend.algorithms.fedper import BodySharing
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, State, report_loss
from fedblend.core.template import record_training, train_spec


@dataclass(frozen=True)
class FedRepOptions:
    # body_epochs = 0 would never train the shared representation (nothing federated, no train_loss): refused
    RANGES: ClassVar[dict] = {"head_epochs": "[0, 10000]", "body_epochs": "[1, 10000]"}
    head_epochs: int = opt(10, "tau_h: epochs of the head update with the representation fixed (paper Sec. 5)")
    body_epochs: int | None = opt(None, "tau: epochs of the representation update (None: [train] epochs)")


@register_method
class FedRep(BodySharing):
    name = "fedrep"
    display_name = "FedRep"
    options_cls = FedRepOptions
    paper = "Collins et al., Exploiting Shared Representations for Personalized Federated Learning, ICML 2021"

    def local_training(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx):
        """Alg. 1 lines 6-7: the head phase (Eq. 3) then the representation phase (Eq. 4), each a spec that
        trains only its own tensors; ``train_loss`` reports the representation phase."""
        head, body = ctx.model.head_names(), ctx.model.body_names()
        res = yield train_spec(self, params, msg, cstate, ctx, trainable=head, epochs=self.opts.head_epochs,
                                    stream="head")
        cstate = record_training(res, cstate, ctx)
        report_loss(ctx, "head_loss", res)
        res = yield train_spec(self, res.params, msg, cstate, ctx, trainable=body, epochs=self.opts.body_epochs)
        return res, record_training(res, cstate, ctx)
