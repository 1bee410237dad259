"""A client transform plug-in: blend the received model with the client's own, with one fixed weight.

``method = "myprox+mix"`` (or ``"fedavg+mix"``): before local training, client i starts from
``beta * own + (1 - beta) * received`` on the model's head layers (the received model elsewhere). The simplest
member of the family ALA belongs to (ALA learns the weights element-wise; here it is one number).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from fedblend.core.method import ClientTransform
from fedblend.core.traits import TransformTraits


@dataclass(frozen=True)
class MixOptions:
    RANGES: ClassVar[dict] = {"beta": "[0, 1]"}
    beta: float = field(default=0.5, metadata={"help": "weight of the client's own head in the blend (0 = the "
                                                       "received model, as without the transform)"})


class Mix(ClientTransform):
    name = "mix"
    options_cls = MixOptions

    def declare(self):
        # the host keeps the client's model after training (cstate["params"]); it blends the model the server
        # sends (global, or personalized as FedAMP's u_i)
        return TransformTraits(needs_local_model=True, requires_received=True)

    def blend(self, params, cstate, ctx):
        own = cstate.get("params")
        if not own:  # first contact: nothing of its own yet
            return params
        head = set(ctx.model.head_names())
        b = self.opts.beta
        return {k: b * own[k] + (1 - b) * v if k in head else v for k, v in params.items()}

    def apply(self, method, params, cstate, ctx):
        return self.blend(params, cstate, ctx), cstate

    def eval_params(self, method, msg, cstate, ctx, params):
        return self.blend(params, cstate, ctx)  # evaluate the model the client would train from

    def eval_description(self, method, current):
        return f"{current}, its head blended {self.opts.beta:g} own / {1 - self.opts.beta:g} that model (mix)"
