"""The method interface, implemented by :mod:`fedblend.algorithms`.

A method is a few functions over explicit state (fedjax ``FederatedAlgorithm`` style).

The engine (:mod:`fedblend.core.engine`) owns the one round loop and calls, per round::

    payload          = method.downlink(server, cid, setup)            # for each selected client
    upload, cstate   = method.client_update(payload, cstate, ctx)     # on the client (any backend)
    server           = method.aggregate(server, uploads, setup)       # once, all uploads of the round
    eval params      = method.eval_params(server, cstate, ctx)        # for every client, when evaluating

``server`` and ``cstate`` are plain dictionaries of tensors (and numbers) that the engine stores, checkpoints
and never lets a method keep elsewhere. ``client_update`` is a template::

    params = client_init(payload, cstate)        # default: own parameters overwritten by what was received
    params = transform(params, cstate) ...       # composable client-init parts, e.g. ALA ("fedavg+ala")
    params = local_train(params, cstate)         # SGD on the client's data (momentum kept if configured)
    upload = upload(params)                      # the shared part + the number of samples

so a method overrides only what differs from FedAvg, and a :class:`ClientTransform` composes with every method
that keeps the template, without either knowing the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from fedblend.common.params import Params, clone, select, weighted_average
from fedblend.common.rng import SeedTree
from fedblend.core.training import TrainConfig, TrainResult, sgd_train
from fedblend.data.federated import ClientData
from fedblend.models.zoo import FedModel

State = dict[str, Any]


@dataclass
class Setup:
    """Everything fixed for a run that methods may read."""

    model: FedModel
    init_params: Params
    train: TrainConfig
    num_clients: int
    num_samples: list[int]
    rounds: int
    tree: SeedTree
    rnd: int = 0  # the current round, set by the engine before each round


@dataclass
class ClientCtx:
    """What a client sees while it runs: its id, the round, its data and its random streams."""

    cid: int
    rnd: int
    data: ClientData
    setup: Setup
    tree: SeedTree  # root of this client's streams in this round: tree.torch("batches") etc.
    stats: dict = field(default_factory=dict)  # numbers a method wants in the round's metrics

    @property
    def model(self) -> FedModel:
        return self.setup.model

    @property
    def train(self) -> TrainConfig:
        return self.setup.train


@dataclass(frozen=True)
class NoOptions:
    pass


class ClientTransform:
    """A composable client-side part applied after ``client_init`` and before local training.

    ``apply`` returns the parameters to train from and the updated client state; a transform keeps its own
    state under ``cstate[self.key]``. ``after_train`` sees the trained parameters (e.g. to remember them).
    """

    name: ClassVar[str] = "transform"
    options_cls: ClassVar[type] = NoOptions

    def __init__(self, options: Any = None):
        self.opts = options if options is not None else self.options_cls()

    @property
    def key(self) -> str:
        return self.name

    def apply(self, method: Method, params: Params, cstate: State, ctx: ClientCtx) -> tuple[Params, State]:
        raise NotImplementedError

    def after_train(self, method: Method, params: Params, cstate: State, ctx: ClientCtx) -> State:
        return cstate

    def eval_params(self, method: Method, server: State, cstate: State, ctx: ClientCtx,
                    params: Params) -> Params:
        return params

    def eval_description(self, method: Method, current: str) -> str:
        """What the personalized accuracy evaluates with this transform on (``current``: without it)."""
        return current


class Method:
    """FedAvg behaviour by default; subclasses override the steps that differ (see module docstring)."""

    name: ClassVar[str] = "method"
    options_cls: ClassVar[type] = NoOptions
    paper: ClassVar[str] = ""
    #: what the reported personalized accuracy evaluates, written into every result
    eval_model: ClassVar[str] = "each client's model after its last local training"
    #: "all": every parameter travels; "body": the head stays on the client
    shares: ClassVar[str] = "all"
    #: whether the method has a global model whose accuracy is reported beside the personalized one
    has_global: ClassVar[bool] = True

    @property
    def sequential_server(self) -> bool:
        """True: the engine runs downlink -> client -> aggregate one selected client at a time, so later clients
        of a round see earlier uploads (e.g. FedAPA's authors' code). False (default): all downlinks are made from
        the round's starting server state and ``aggregate`` sees every upload at once (the papers' "in parallel")."""
        return False

    def __init__(self, options: Any = None, transforms: list[ClientTransform] | None = None):
        self.opts = options if options is not None else self.options_cls()
        self.transforms = list(transforms or [])

    # ----------------------------------------------------------------------------------------- helpers
    @property
    def label(self) -> str:
        return "+".join([self.name] + [t.name for t in self.transforms])

    def describe_eval(self) -> str:
        """``eval_model`` as changed by the transforms (written into every result's protocol)."""
        desc = self.eval_model
        for t in self.transforms:
            desc = t.eval_description(self, desc)
        return desc

    def shared_names(self, setup: Setup) -> list[str]:
        return list(setup.init_params) if self.shares == "all" else setup.model.body_names()

    # ----------------------------------------------------------------------------------------- server
    def init_server(self, setup: Setup) -> State:
        return {"global": clone(setup.init_params)}

    def downlink(self, server: State, cid: int, setup: Setup) -> Params:
        return select(server["global"], self.shared_names(setup))

    def aggregate(self, server: State, uploads: Mapping[int, State], setup: Setup) -> State:
        """FedAvg (McMahan et al. 2017, Alg. 1): data-size-weighted mean of the uploaded parameters."""
        cids = sorted(uploads)
        avg = weighted_average([uploads[c]["params"] for c in cids], [uploads[c]["num_samples"] for c in cids])
        return {**server, "global": {**server["global"], **avg}}

    def global_params(self, server: State) -> Params | None:
        return server.get("global") if self.has_global else None

    # ----------------------------------------------------------------------------------------- client
    def init_client(self, cid: int, setup: Setup) -> State:
        return {"params": clone(setup.init_params)}

    def client_init(self, payload: Params, cstate: State, ctx: ClientCtx) -> Params:
        return {**cstate["params"], **payload}

    def apply_transforms(self, params: Params, cstate: State, ctx: ClientCtx) -> tuple[Params, State]:
        for t in self.transforms:
            params, cstate = t.apply(self, params, cstate, ctx)
        return params, cstate

    def extra_loss(self, payload: Params, params: Params, cstate: State, ctx: ClientCtx):
        """Optional regulariser added to the training loss (None = plain cross-entropy)."""
        return None

    def local_train(self, params: Params, cstate: State, ctx: ClientCtx, extra_loss=None,
                    trainable=None, epochs: int | None = None) -> tuple[TrainResult, State]:
        keep = ctx.train.optimizer_state == "keep"
        res = sgd_train(ctx.model, params, ctx.data.train_x, ctx.data.train_y, ctx.train,
                        ctx.tree.torch("batches"), momentum=cstate.get("momentum") if keep else None,
                        extra_loss=extra_loss, trainable=trainable, epochs=epochs)
        if keep and res.momentum is not None:
            cstate = {**cstate, "momentum": res.momentum}
        ctx.stats["train_loss"] = res.mean_loss
        return res, cstate

    def upload(self, params: Params, cstate: State, ctx: ClientCtx) -> State:
        return {"params": select(params, self.shared_names(ctx.setup)), "num_samples": ctx.data.num_train}

    def client_update(self, payload: Params, cstate: State, ctx: ClientCtx) -> tuple[State, State]:
        params = self.client_init(payload, cstate, ctx)
        params, cstate = self.apply_transforms(params, cstate, ctx)
        res, cstate = self.local_train(params, cstate, ctx, extra_loss=self.extra_loss(payload, params, cstate, ctx))
        cstate = {**cstate, "params": res.params}
        for t in self.transforms:
            cstate = t.after_train(self, res.params, cstate, ctx)
        return self.upload(res.params, cstate, ctx), cstate

    # ----------------------------------------------------------------------------------------- evaluation
    def personalized_params(self, server: State, cstate: State, ctx: ClientCtx) -> Params:
        """The method's own personalized model of client ``ctx.cid`` (default: its model after local training)."""
        return cstate["params"]

    def eval_params(self, server: State, cstate: State, ctx: ClientCtx) -> Params:
        """Parameters of client ``ctx.cid``'s personalized model, as the method's paper evaluates it: the method's
        :meth:`personalized_params`, then each transform's ``eval_params`` on top."""
        params = self.personalized_params(server, cstate, ctx)
        for t in self.transforms:
            params = t.eval_params(self, server, cstate, ctx, params)
        return params


def comm_bytes(obj: Any) -> int:
    """Bytes of every tensor inside ``obj`` (nested dicts / lists), i.e. what a message costs on the wire."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, Mapping):
        return sum(comm_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(comm_bytes(v) for v in obj)
    return 0
