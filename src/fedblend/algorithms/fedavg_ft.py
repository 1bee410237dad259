"""FedAvg-FT ("FedAvg-C" in the FedALA paper): FedAvg, then each client fine-tunes the global model on its
training data before evaluation. Training is exactly FedAvg's (fine-tuning draws from its own random streams),
so the run's ``global_accuracy`` equals the FedAvg run with the same seed."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.registry import register_method
from fedblend.common.options import opt
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, Message, State, Traits, train_now
from fedblend.core.training import TrainSpec


@dataclass(frozen=True)
class FineTuneOptions:
    RANGES: ClassVar[dict] = {"ft_epochs": "[0, 10000]"}
    ft_epochs: int = opt(1, "local epochs of fine-tuning before evaluation")


@register_method
class FedAvgFT(FedAvg):
    name = "fedavg-ft"
    display_name = "FedAvg-FT"
    options_cls = FineTuneOptions
    paper = "FedALA paper (Zhang et al., AAAI 2023), baseline FedAvg-C"

    def eval_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """Fine-tune the model FedAvg would evaluate (with a transform, e.g. "fedavg-ft+ala", the model the
        transform gives) for ``ft_epochs`` on the client's training data, from the ``finetune`` stream."""
        start = super().eval_params(msg, cstate, ctx)
        spec = TrainSpec(params=start, epochs=self.opts.ft_epochs, stream="finetune",
                         trainable=self.finetune_names(ctx))
        return train_now(spec, ctx).params

    def finetune_names(self, ctx: ClientCtx) -> list[str] | None:
        """The tensors fine-tuned before evaluation (None: all)."""
        return None

    def declare(self, choice: str) -> Traits:
        return replace(super().declare(choice),
                       eval_model="{}; then fine-tuned for ft_epochs on each client's training data")
