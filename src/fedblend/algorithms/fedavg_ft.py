"""FedAvg-FT ("FedAvg-C" in the FedALA paper): FedAvg, then each client fine-tunes the global model on its
training data before evaluation. Training is exactly FedAvg's (fine-tuning draws from its own random streams),
so the run's ``global_accuracy`` equals the FedAvg run with the same seed."""

from __future__ import annotations

from dataclasses import dataclass

from fedblend.algorithms.fedavg import FedAvg
from fedblend.algorithms.registry import register_method
from fedblend.common.params import Params
from fedblend.core.method import ClientCtx, State
from fedblend.core.training import sgd_train


@dataclass(frozen=True)
class FineTuneOptions:
    ft_epochs: int = 1  # local epochs of fine-tuning before evaluation


@register_method
class FedAvgFT(FedAvg):
    name = "fedavg-ft"
    options_cls = FineTuneOptions
    paper = "FedALA paper (Zhang et al., AAAI 2023), baseline FedAvg-C"
    eval_model = "the global model after aggregation, fine-tuned for ft_epochs on each client's training data"

    def eval_params(self, server: State, cstate: State, ctx: ClientCtx) -> Params:
        # with a client transform (e.g. "fedavg-ft+ala") the fine-tuning starts from the model the transform gives
        start = super().eval_params(server, cstate, ctx)
        res = sgd_train(ctx.model, start, ctx.data.train_x, ctx.data.train_y, ctx.train,
                        ctx.tree.torch("finetune"), epochs=self.opts.ft_epochs)
        return res.params

    def describe_eval(self) -> str:
        if not self.transforms:
            return self.eval_model
        return f"{super().describe_eval()}; then fine-tuned for ft_epochs on each client's training data"
