"""Class prototypes (the mean feature ``f(x)`` of each class on a client's training data, FedProto Eq. 4) and the
base of methods whose clients upload them instead of parameters (FedProto, FedGH)."""

from __future__ import annotations

from dataclasses import replace

import torch

from fedblend.algorithms.parts.features import features_of
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, Method, RunInfo, State, Traits
from fedblend.core.training import TrainResult

PROTOS = "protos"  # message record: {str(class): prototype vector}
COUNTS = "class_counts"  # reply metric: [samples of class 0, of class 1, ...] (every class of the model's output)


def num_classes(run: RunInfo) -> int:
    """Output size of the model (the last head tensor is the output layer's bias)."""
    return int(run.init_params[run.model.head_names()[-1]].shape[0])


def class_prototypes(feats: torch.Tensor, y: torch.Tensor) -> tuple[Params, dict[str, int]]:
    """FedProto Eq. 4: the mean feature of every class present in ``y`` (keys ``str(class)``), and the counts."""
    protos: Params = {}
    counts: dict[str, int] = {}
    for c in torch.unique(y).tolist():
        mask = y == c
        protos[str(c)] = feats[mask].mean(0)
        counts[str(c)] = int(mask.sum())
    return protos, counts


def local_prototypes(params: Params, ctx: ClientCtx) -> tuple[Params, dict[str, int]]:
    """Prototypes of the client's training data under ``params`` (after local training)."""
    return class_prototypes(features_of(ctx.model, params, ctx.data.train_x), ctx.data.train_y)


class PrototypeUpload(Method):
    """Clients upload class prototypes of their trained model and no parameter (FedProto, FedGH)."""

    def declare(self, choice: str) -> Traits:
        return replace(super().declare(choice), global_model=False, shares="none")  # no parameter goes up

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        protos, counts = local_prototypes(res.params, ctx)
        per_class = [counts.get(str(c), 0) for c in range(num_classes(ctx.run))]
        return Message({PROTOS: protos}, {"num_samples": ctx.data.num_train, COUNTS: per_class})


def uploaded_counts(reply: Message) -> dict[str, int]:
    """A reply's class counts as ``{str(class): samples}`` over the classes it holds (the keys of its prototypes)."""
    return {str(c): int(n) for c, n in enumerate(reply.metrics[COUNTS]) if n}
