"""The method interface: a server half and a client half that talk only in :class:`~fedblend.core.message.Message`s.

A method (``fedblend.algorithms``) is a :class:`Method`: a :class:`ServerHalf` and a :class:`ClientHalf` over
explicit state, built from one options value (``method.opts``) and declared by one function of it
(:meth:`Method.declare` -> :class:`~fedblend.core.traits.Traits`). A runtime -- the in-process simulator
(:mod:`fedblend.core.engine`) with any backend, worker processes, or Flower -- carries the messages.

Server half (sees its state, the messages it received and a :class:`ServerCtx`: round, its random streams,
the public run facts), in Flower's vocabulary::

    server = method.init_server(sctx)                        # Strategy.initialize_parameters
    msg    = method.configure(phase, server, cid, sctx)      # per selected client, for each phase of the round
    server = method.aggregate(phase, server, replies, sctx)  # replies: {cid: Message}
    msg    = method.configure_evaluate(server, cid, sctx)    # what a personalized evaluation needs

``configure`` / ``aggregate`` route the phase ``"train"`` to ``configure_train`` / ``aggregate_train``; a round is
``method.phases(sctx)``, ``("train",)`` by default, and a method that needs more exchanges (DBE's initialisation
pass, pFedRLLA's upload) adds phases and routes them there.

Client half (sees its own state, its own data and the message, through a :class:`ClientCtx`)::

    cstate        = method.init_client(cctx)                 # on the client, at first contact
    reply, cstate = method.client_step(phase, msg, cstate, cctx)   # a generator: yields TrainSpecs
    spec          = method.evaluate(msg, cstate, cctx)       # the personalized model to evaluate: EvalSpec

A training exchange is one template, :func:`fedblend.core.template.client_train`, written once and closed (no
method re-types it); methods vary it through the client half's hooks ``before_training``, ``client_init``,
``scored_params``, ``local_training`` (default: one :func:`~fedblend.core.template.train_spec` with the method's
``loss_terms``, then :func:`~fedblend.core.template.record_training`) and ``reply``, so a method overrides only
what differs from FedAvg, and a :class:`ClientTransform` (ALA) composes with every method without either knowing
the other. Plain code between a generator's yields (ALA's weight learning, Per-FedAvg's inner loop) runs on the
client as it is.

Evaluation is a protocol, not an option per method: the run's ``[eval] model`` names which model of each client
the personalized accuracy evaluates, one of the choices the method offers (:meth:`Method.eval_models`, composed
with its transforms'; the first is the default, its paper's): ``"received"`` (what the client would start
training from now, ``client_init`` of the evaluation message), ``"trained"`` (its model after its last local
training) or a method's own (FedPHP's ``"hpm"``, FedProto's ``"proto"``, ALA's ``"ala"``). The client half
answers with an :class:`~fedblend.core.evaluation.EvalSpec`: ``evaluate`` -> ``EvalSpec(eval_params(...))``,
``eval_params`` -> the method's ``personalized_params`` with each transform's on top; FedProto and DBE give
their own forward.

States (``server``, ``cstate``) are plain data -- tensors, numbers, strings, dicts and lists of them -- that the
runtime stores, checkpoints and moves with :mod:`fedblend.common.codec`; a method object holds only its options.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Generator, Mapping, Sequence
from dataclasses import fields
from typing import Any, ClassVar

from fedblend.common.params import Params, clone, select, weighted_average
from fedblend.core.context import (  # noqa: F401  (importable from here)
    ClientCtx,
    ClientWork,
    RunInfo,
    ServerCtx,
    State,
    client_tree,
    server_tree,
)
from fedblend.core.evaluation import EvalSpec
from fedblend.core.message import Message, comm_bytes
from fedblend.core.returns import register, returned
from fedblend.core.template import (  # noqa: F401  (helpers a method's hooks call, importable from here)
    BEFORE_AFTER,
    client_train,
    eval_params,
    record_training,
    report_loss,
    same_tensors,
    score_before_after,
    shared_names,
    train_now,
    train_spec,
)
from fedblend.core.training import LossTerm, TrainResult, TrainSpec
from fedblend.core.traits import (
    LEGACY_DECLARATIONS,
    TRAINED,
    Traits,
    eval_choices,
    resolve_traits,
)
from fedblend.core.transform import ClientTransform, NoOptions  # noqa: F401  (importable from here)
from fedblend.models.zoo import FedModel

__all__ = ["ClientCtx", "ClientHalf", "ClientTransform", "ClientWork", "EvalSpec", "Message", "Method", "RunInfo",
           "ServerCtx", "ServerHalf", "State", "Traits", "comm_bytes"]


# ============================================================================================= the two halves
class ServerHalf:
    """The server half of a method, in Flower's vocabulary: state from ``init_server``, per round one message per
    selected client (``configure_train``) and the new state from their replies (``aggregate_train``), and the
    evaluation message (``configure_evaluate``). FedAvg by default (McMahan et al. 2017, Alg. 1)."""

    #: the hooks of this half a method author may override (``tests/test_contract.py`` counts them)
    HOOKS: ClassVar[tuple[str, ...]] = ("init_server", "phases", "configure", "aggregate", "configure_train",
                                        "aggregate_train", "configure_evaluate")

    def init_server(self, sctx: ServerCtx) -> State:
        """The server state before round 1 (default: the initial model as ``"global"``)."""
        return {"global": clone(sctx.run.init_params)}

    def phases(self, sctx: ServerCtx) -> Sequence[str]:
        """The exchanges of round ``sctx.rnd``, in order (default: one, ``"train"``)."""
        return ("train",)

    def configure(self, phase: str, server: State, cid: int, sctx: ServerCtx) -> Message:
        """The message of ``phase`` for client ``cid`` (``"train"``: :meth:`configure_train`)."""
        if phase == "train":
            return returned(self, "configure_train", self.configure_train(server, cid, sctx), sctx.rnd, cid)
        raise ValueError(f"{self.name} has no phase {phase!r}")

    def aggregate(self, phase: str, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """The server state after ``phase``'s replies (``"train"``: :meth:`aggregate_train`)."""
        if phase == "train":
            return returned(self, "aggregate_train", self.aggregate_train(server, replies, sctx), sctx.rnd)
        raise ValueError(f"{self.name} has no phase {phase!r}")

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """The training message (default: the shared part of the global model, ``Traits.shares``)."""
        return Message({"params": select(server["global"], shared_names(self, sctx.run))})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """FedAvg (McMahan et al. 2017, Alg. 1): data-size-weighted mean of the uploaded parameters."""
        cids = sorted(replies)
        avg = weighted_average([replies[c].params() for c in cids], [replies[c].metrics["num_samples"] for c in cids])
        return {**server, "global": {**server["global"], **avg}}

    def configure_evaluate(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """The evaluation message: what client ``cid`` would receive to train now (``"params"``), and the global
        model (``"global"``) where the method reports one; empty where the client evaluates its own model."""
        if self.traits.evaluates_own_model:
            return Message()
        msg = self.configure_train(server, cid, sctx)
        glob = self.global_params(server)
        if glob is not None:
            msg.arrays["global"] = glob
        return msg

    def global_params(self, server: State) -> Params | None:
        """Machinery: the model whose accuracy is reported as the global one (``Traits.reports_global``)."""
        return server.get("global") if self.traits.reports_global else None


class ClientHalf:
    """The client half of a method: its state (``init_client``), its step of an exchange (``client_step``: the
    closed training template, :func:`~fedblend.core.template.client_train`, varied by the hooks below) and its
    personalized model as an :class:`EvalSpec` (``evaluate``). FedAvg by default."""

    #: the hooks of this half a method author may override (``tests/test_contract.py`` counts them)
    HOOKS: ClassVar[tuple[str, ...]] = ("init_client", "client_step", "before_training", "client_init", "loss_terms",
                                        "local_training", "scored_params", "reply", "personalized_params",
                                        "eval_params", "evaluate")

    def init_client(self, ctx: ClientCtx) -> State:
        """The client state at first contact (default: the initial model where the client keeps one)."""
        return {"params": clone(ctx.run.init_params)} if self.traits.keeps_model else {}

    def client_step(self, phase: str, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        """The client's work in ``phase``, a generator of TrainSpecs returning ``(reply, state)`` (``"train"``:
        the template, :func:`~fedblend.core.template.client_train`)."""
        if phase == "train":
            return client_train(self, msg, cstate, ctx)
        raise ValueError(f"{self.name} has no phase {phase!r}")

    def before_training(self, msg: Message, cstate: State, ctx: ClientCtx) -> State:
        """Client-side work before the client initialises its model (default: none)."""
        return cstate

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The model the client trains from: the received parameters over its own (a head that is not sent
        stays)."""
        return {**cstate.get("params", {}), **msg.params()}

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        """Extra terms of the training loss (none = plain cross-entropy)."""
        return ()

    def local_training(self, params: Params, msg: Message, cstate: State,
                       ctx: ClientCtx) -> Generator[TrainSpec, TrainResult, tuple[TrainResult, State]]:
        """The template's training step: one spec (:func:`~fedblend.core.template.train_spec`), then
        :func:`~fedblend.core.template.record_training`. A method that trains in several specs (FedRep's head then
        body phases, Ditto's personalized model) or in a loop of its own overrides this and returns the result
        whose ``params`` are the client's trained model, and the updated state."""
        res = yield train_spec(self, params, msg, cstate, ctx)
        return res, record_training(res, cstate, ctx)

    def scored_params(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx) -> Params | EvalSpec:
        """The model that ``params`` stand for when scored before / after training: parameters, or an
        :class:`EvalSpec` (default: ``params``; DBE adds its representation bias in its forward)."""
        return params

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """The training reply, from the trained model (``res.params``; ``res.extras`` holds what the method's
        ``local_training`` left for it): the shared parameters and ``num_samples``."""
        shared = select(res.params, shared_names(self, ctx.run))
        return Message({"params": shared}, {"num_samples": ctx.data.num_train})

    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The method's own personalized model of the client: its model after local training, or what it would
        start training from (``Traits.evaluates_received_model``)."""
        return self.client_init(msg, cstate, ctx) if self.traits.evaluates_received_model else cstate["params"]

    def eval_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """Parameters of the client's personalized model, per ``[eval] model``: :meth:`personalized_params` with
        each transform's on top (:func:`~fedblend.core.template.eval_params`); FedAvg-FT fine-tunes them."""
        return eval_params(self, msg, cstate, ctx)

    def evaluate(self, msg: Message, cstate: State, ctx: ClientCtx) -> EvalSpec:
        """The client's personalized model as an :class:`EvalSpec`: :meth:`eval_params` with the model's own
        forward pass; a method that classifies otherwise (FedProto's nearest prototype, DBE's bias) returns its
        own forward."""
        return EvalSpec(returned(self, "eval_params", self.eval_params(msg, cstate, ctx), ctx.rnd, ctx.cid))


class _Pretrainable:
    """``Method.pretrainable``, read from the class (``fedblend pretrain`` checks it before building anything):
    whether the class has a pre-training run, i.e. defines the classmethods ``pretrain_options(options) -> dict``
    (the pre-training run's options from a run's) and ``save_pretrained(server, path)`` (what it learned, from the
    final server state)."""

    def __get__(self, obj: Any, cls: type) -> bool:
        return bool(cls._legacy.get("pretrainable")) or callable(getattr(cls, "pretrain_options", None))


#: former hooks that are machinery now (:mod:`fedblend.core.template`): a class that defines one is refused, naming
#: what to do instead
NOT_HOOKS = {
    "client_train": "the template is closed: vary it through the client half's hooks",
    "apply_transforms": "transforms are applied by the template",
    "train_spec": "override local_training and yield fedblend.core.template.train_spec(self, ..., **fields)",
    "record_training": "call fedblend.core.template.record_training(res, cstate, ctx) from local_training",
    "shared_names": "declare Traits(shares=...) in declare()",
    "resolve_traits": "declare the traits in declare(self, choice) -> Traits",
    "eval_choices": "offer choices in eval_models(); Traits(eval_transforms=False) keeps the transforms' out",
}


class Method(ServerHalf, ClientHalf):
    """A federated method: its server half and its client half, built from one options value (``self.opts``,
    an instance of ``options_cls``) and the client transforms composed with it. FedAvg by default.

    The members a method author knows (at most 20 hooks, ``tests/test_contract.py`` checks):

    * identity: ``name``, ``options_cls``, ``paper`` (class attributes; ``display_name`` optionally);
    * declarations: :meth:`declare` (the :class:`Traits`, one function of the options and the ``[eval] model``
      in force) and :meth:`eval_models` (the ``[eval] model`` choices);
    * server half (:class:`ServerHalf`): ``init_server``, ``phases``, ``configure``, ``aggregate``,
      ``configure_train``, ``aggregate_train``, ``configure_evaluate``;
    * client half (:class:`ClientHalf`): ``init_client``, ``client_step``, ``before_training``, ``client_init``,
      ``loss_terms``, ``local_training``, ``scored_params``, ``reply``, ``personalized_params``, ``eval_params``,
      ``evaluate``.

    What the runtimes read and no method overrides (:data:`MACHINERY`): ``traits``, ``opts``, ``transforms``,
    ``label``, ``evaluating``, ``eval_choices``, ``global_params``, ``check_model`` and the class-level
    ``pretrainable`` (a class with ``pretrain_options`` / ``save_pretrained`` classmethods has a pre-training
    run). The helpers hooks call are functions of :mod:`fedblend.core.template` (``train_spec``,
    ``record_training``, ``report_loss``, ``shared_names``, ``train_now``)."""

    name: ClassVar[str] = "method"
    options_cls: ClassVar[type] = NoOptions
    paper: ClassVar[str] = ""
    pretrainable = _Pretrainable()
    _legacy: ClassVar[dict[str, Any]] = {}

    #: the declarations of a method (with the halves' HOOKS: everything a method author overrides)
    HOOKS: ClassVar[tuple[str, ...]] = ("declare", "eval_models")
    #: what the runtimes read, not hooks
    MACHINERY: ClassVar[tuple[str, ...]] = ("traits", "opts", "transforms", "label", "evaluating", "eval_choices",
                                            "global_params", "check_model", "pretrainable")

    def __init_subclass__(cls, **kwargs: Any):
        """A class attribute named after a trait would be silently ignored (the rest of fedblend reads
        ``self.traits``): one of the former declarations (:data:`LEGACY_DECLARATIONS`, a plug-in written before
        :meth:`declare`) is still honoured, with a FutureWarning naming ``declare``; any other trait's name, and a
        former hook that is machinery now (:data:`NOT_HOOKS`), is refused where the class is written."""
        super().__init_subclass__(**kwargs)
        body = vars(cls)
        stale = sorted(f.name for f in fields(Traits) if f.name in body and f.name not in LEGACY_DECLARATIONS)
        if stale:
            raise TypeError(f"{cls.__name__} defines {', '.join(stale)} as a class attribute, which nothing reads: "
                            f"declare it in declare(), e.g. def declare(self, choice): return "
                            f"replace(super().declare(choice), {stale[0]}=...)")
        gone = sorted(n for n in NOT_HOOKS if n in body)
        if gone:
            raise TypeError(f"{cls.__name__} overrides {gone[0]}, which is no longer a hook: {NOT_HOOKS[gone[0]]}")
        old = {k: body[k] for k in LEGACY_DECLARATIONS if k in body}
        if old:
            warnings.warn(f"{cls.__name__} declares {', '.join(sorted(old))} as class attributes; declare them in "
                          f"def declare(self, choice) -> Traits (" + ", ".join(
                              f"{k} -> Traits.{LEGACY_DECLARATIONS[k]}" if LEGACY_DECLARATIONS[k] else
                              f"{k} -> eval_models()" if k == "eval_model" else f"{k} -> pretrain_options()"
                              for k in sorted(old)) + "); class attributes stop working in a later release",
                          FutureWarning, stacklevel=2)
            cls._legacy = {**cls._legacy, **old}

    def __init__(self, options: Any = None, transforms: list[ClientTransform] | None = None,
                 eval_choice: str | None = None):
        self.opts = options if options is not None else self.options_cls()
        self.transforms = list(transforms or [])
        self.traits: Traits = resolve_traits(self, eval_choice)

    # -------------------------------------------------------------------------------------- declarations
    def declare(self, choice: str) -> Traits:
        """The method's :class:`Traits`, from its options (``self.opts``) and ``choice``, the ``[eval] model``
        in force (one of :meth:`eval_models`, or a transform's): one function, one name per concept. A subclass
        extends its base's with ``replace(super().declare(choice), keeps_model=False)``. Default: FedAvg's."""
        return Traits()

    def eval_models(self) -> dict[str, str]:
        """The ``[eval] model`` choices the method offers: name -> what the personalized accuracy then evaluates;
        the first is the default (the method's paper). Default: ``{"trained": ...}``, the client's model after its
        last local training; a method whose clients evaluate what they would start training from offers
        ``"received"`` (the name makes ``Traits.evaluates_received_model`` true unless declared)."""
        return {"trained": TRAINED}

    # ------------------------------------------------------------------------------ machinery (runtimes read)
    @property
    def label(self) -> str:
        """The method and its transforms as a run names them (``"fedprox+ala"``)."""
        return "+".join([self.name] + [t.name for t in self.transforms])

    def eval_choices(self) -> dict[str, str]:
        """:meth:`eval_models` composed with the transforms' (ALA offers its own, which replace the host's)."""
        return eval_choices(self)

    def evaluating(self, choice: str | None) -> Method:
        """This method with ``[eval] model = choice`` (None: as it is); a ``ValueError`` for a choice it does
        not offer."""
        if choice is None or choice == self.traits.eval_choice:
            return self
        other = copy.copy(self)
        other.traits = resolve_traits(other, choice)
        return other

    def check_model(self, model: FedModel) -> None:
        """Refuse options that do not fit ``model`` with a :class:`~fedblend.common.errors.ConfigError`; the
        engine calls it before the server half starts, so a bad value fails up front, not in round 1 on a
        client. It asks the transforms (``ClientTransform.check_model``)."""
        for t in self.transforms:
            t.check_model(self, model)


register(ServerHalf, ClientHalf, Method)  # what each hook returns, read from the signatures above
