"""The method interface: a server half and a client half that talk only in :class:`~fedblend.core.message.Message`s.

A method (``fedblend.algorithms``) implements both halves over explicit state; a runtime -- the in-process
simulator (:mod:`fedblend.core.engine`) with any backend, or worker processes -- carries the messages:

Server half (sees its state, the messages it received and a :class:`ServerCtx`: round, its random streams,
the public run facts)::

    server = method.init_server(sctx)
    msg    = method.configure(phase, server, cid, sctx)      # per selected client, for each phase of the round
    server = method.aggregate(phase, server, replies, sctx)  # replies: {cid: Message}
    msg    = method.configure_evaluate(server, cid, sctx)    # what a personalized evaluation needs

Client half (sees its own state, its own data and the message, through a :class:`ClientCtx`)::

    cstate        = method.init_client(cctx)                 # on the client, at first contact
    reply, cstate = method.client_step(phase, msg, cstate, cctx)   # a generator: yields TrainSpecs (below)
    spec          = method.evaluate(msg, cstate, cctx)       # the personalized model to evaluate: EvalSpec

A round is ``method.phases(sctx)``, ``("train",)`` by default: one exchange. Methods that need more (a
validation score of the received model before training, several models sent out) add phases; the engine runs
them in order, each as configure -> clients -> aggregate.

Client training is a spec a backend runs: :meth:`Method.client_train` is a generator that ``yield``s
:class:`~fedblend.core.training.TrainSpec`s and receives each one's :class:`TrainResult`; plain code between
the yields (ALA's blend-weight learning, Per-FedAvg's inner loop) runs on the client as it is. It is one template,
written once and closed: no method re-types it (``tests/test_contract.py`` checks), methods vary it through
hooks::

    cstate = before_training(msg, cstate)    # hook: client-side work before anything else (PartialFed's strategy)
    params = client_init(msg, cstate)        # hook: own parameters overwritten by what was received
    params = transform(params, cstate) ...   # composable client-side parts, e.g. ALA ("fedavg+ala")
    score "bp" on scored_params(params)      # under eval.before_after; hook: the model as evaluated (DBE's
                                             # bias, an EvalSpec)
    result = yield from local_training(...)  # hook: one spec with the method's loss terms (FedProx: proximal);
                                             # FedRep / Ditto / FedPAC yield more specs, own-loop methods none
    score "ap" on scored_params(result.params)
    keep the model, transforms' after_train
    reply  = reply(result, msg, cstate)      # hook: the shared part + num_samples (+ a method's records)

so a method overrides only what differs from FedAvg, and a :class:`ClientTransform` composes with every method,
without either knowing the other.

Evaluation is a protocol, not an option per method: the run's ``[eval] model`` names which model of each client
the personalized accuracy evaluates, one of the choices the method offers (:meth:`Method.eval_models`, composed
with its transforms' in :meth:`Method.eval_choices`; the first is the default, its paper's): ``"received"``
(what the client would start training from now, ``client_init`` of the evaluation message), ``"trained"`` (its
model after its last local training) or a method's own (FedPHP's ``"hpm"``, FedProto's ``"proto"``, ALA's
``"ala"``). The client half answers with an :class:`~fedblend.core.evaluation.EvalSpec`, parameters and, where
the method classifies otherwise than the model's forward pass, its own :class:`Forward`::

    spec = evaluate(msg, cstate)             # EvalSpec(eval_params(...)); FedProto, DBE: their own forward
    params = eval_params(msg, cstate)        # personalized_params (the choice), then each transform's
                                             # eval_params; one that blends the received model (ALA) is handed
                                             # client_init's model, as in training

States (``server``, ``cstate``) are plain data -- tensors, numbers, strings, dicts and lists of them -- that the
runtime stores, checkpoints and moves with :mod:`fedblend.common.codec`; a method object holds only its options.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

import torch

from fedblend.common.params import Params, clone, select, weighted_average
from fedblend.common.rng import SeedTree
from fedblend.core.evaluation import EvalSpec, as_eval_spec, evaluate_params
from fedblend.core.message import Message, comm_bytes
from fedblend.core.training import LossTerm, TrainConfig, TrainResult, TrainSpec, merge_momentum, run_spec
from fedblend.data.federated import ClientData
from fedblend.models.zoo import FedModel

State = dict[str, Any]
ClientWork = Generator[TrainSpec, TrainResult, tuple[Message, State]]

__all__ = ["ClientCtx", "ClientTransform", "ClientWork", "EvalSpec", "Message", "Method", "RunInfo", "ServerCtx",
           "State", "Traits", "comm_bytes"]


@dataclass(frozen=True)
class Traits:
    """What the engine, the runtimes, the registry and the reports know about a built method: one frozen value,
    one name per concept. A method *declares* it in one function of its options and the ``[eval] model`` in force,
    :meth:`Method.declare` (``return Traits(shares="body")``); building the method resolves what is left open
    (a None below, the evaluation description) and composes its transforms (:func:`resolve_traits`). Nothing reads
    a method's behaviour flags anywhere else."""

    #: what travels: "all" parameters, the "body" (the head stays on the client)
    shares: str = "all"
    #: the server keeps a global model that its clients train from (FedAvg's; FedPer's global body): what a
    #: transform that needs a global model (``ClientTransform.requires_global``) and ALA's wording read
    global_model: bool = True
    #: the accuracy of the server's ``"global"`` model is reported beside the personalized one (None: as
    #: ``global_model``; FedPer and FedRep keep a global body, whose initial head is never trained: False)
    reports_global: bool | None = None
    #: each client's training starts from a model the server sends it -- the global model, or a personalized one
    #: (FedAMP's cloud model u_i) -- so a transform can blend that received model with the client's own last model
    #: (ALA, FedALA Alg. 1); None: as ``global_model``
    trains_from_received: bool | None = None
    #: the client state holds the client's model between rounds (a private head, a local model); methods whose
    #: clients always start from what they receive (FedAvg, FedALP) declare False (a transform that needs it,
    #: such as ALA, turns it on)
    keeps_model: bool = True
    #: some client work is plain code outside TrainSpecs (Per-FedAvg's, pFedMe's inner solvers; a transform's own
    #: loop); a batching backend runs such clients one by one
    own_loop: bool = False
    #: client transforms (ALA, ...) can change the model the client trains from; a method whose local training
    #: ignores the template's ``params`` declares False and the registry refuses ``method+transform``
    accepts_transforms: bool = True
    #: the personalized model evaluated is what the client would start training from now (``client_init`` of the
    #: evaluation message: FedAvg's global model, FedPer's received body with its own head); False: its model after
    #: its last local training (``cstate["params"]``); None: whether the ``[eval] model`` in force is "received"
    evaluates_received_model: bool | None = None
    #: the client evaluates a model it holds, so the evaluation message is empty
    evaluates_own_model: bool = False
    #: the client transforms change the model evaluated (their ``[eval] model`` choices and ``eval_params``
    #: apply); False: Ditto evaluates its personalized v_k, which no transform touches
    eval_transforms: bool = True
    #: the engine runs configure -> client -> aggregate one selected client at a time, so later clients of a
    #: round see earlier uploads (e.g. FedAPA's authors' code); False: every message of a round is made from the
    #: round's starting server state and ``aggregate`` sees every reply at once
    sequential_server: bool = False
    #: the reply records whose entries are model parameters (each name one of the model's, its shape and a
    #: floating dtype: :mod:`fedblend.core.replies`); other records hold what the method likes
    param_records: tuple[str, ...] = ("params",)
    #: names those records may carry besides the model's parameters (e.g. a learned scalar uploaded with the model)
    extra_entries: tuple[str, ...] = ()
    #: what the reported personalized accuracy evaluates, written into every result: declared, a template in which
    #: ``{}`` stands for the description of the ``[eval] model`` in force (:meth:`Method.eval_models`, composed
    #: with the transforms'), e.g. FedAvg-FT's ``"{}; then fine-tuned ..."``; resolved, the description itself
    eval_model: str = "{}"
    #: resolved, never declared: prefixes of the client stats the engine records per client
    #: (``stats_per_client`` of the round's metrics) besides their mean over the selected clients: the transforms'
    per_client_stats: tuple[str, ...] = ()
    #: resolved, never declared: the ``[eval] model`` in force, one of :meth:`Method.eval_choices`
    eval_choice: str = ""


#: the class attributes that declared a method's traits before :meth:`Method.declare` (a plug-in that still sets
#: them is built with a FutureWarning): old name -> the :class:`Traits` field ("" where it is not a field)
LEGACY_DECLARATIONS = {
    "eval_model": "", "shares": "shares", "has_global": "global_model",
    "trains_from_received": "trains_from_received", "client_keeps_model": "keeps_model",
    "client_own_loop": "own_loop", "accepts_transforms": "accepts_transforms",
    "evaluates_received_model": "evaluates_received_model", "evaluates_own_model": "evaluates_own_model",
    "pretrainable": "", "param_records": "param_records", "extra_entries": "extra_entries",
}
#: what a method evaluates unless it says otherwise (:meth:`Method.eval_models`)
TRAINED = "each client's model after its last local training"


@dataclass(frozen=True)
class RunInfo:
    """The public facts of a run, known to the server and to every client (a Flower app's run config): the
    model architecture and its initial parameters (both built from the config and the seed), the training
    settings, the number of clients and rounds. No client's data or data size is in here."""

    model: FedModel
    init_params: Params
    train: TrainConfig
    num_clients: int
    rounds: int
    seed: int
    device: str = "cpu"

    @property
    def client_ids(self) -> range:
        return range(self.num_clients)


@dataclass(frozen=True)
class ServerCtx:
    """What the server half sees besides its state and the messages: the round, its random streams, the run."""

    run: RunInfo
    rnd: int  # 0-based round
    tree: SeedTree  # the server's streams in this round
    #: numbers (or lists of numbers) the server half reports for the round's metrics, e.g. its own timings
    stats: dict = field(default_factory=dict)

    @property
    def model(self) -> FedModel:
        return self.run.model


@dataclass
class ClientCtx:
    """What a client half sees besides its state and the message: its id, the round, its own data, its random
    streams, the public run facts, and a dict of numbers for the round's metrics."""

    cid: int
    rnd: int
    data: ClientData
    run: RunInfo
    tree: SeedTree  # root of this client's streams in this round: tree.torch("batches") etc.
    stats: dict = field(default_factory=dict)
    #: a memo the client's runtime keeps between calls, *not* state: never checkpointed, possibly empty (another
    #: process, a resumed run). A client half may store results there that it would otherwise compute again,
    #: only where the result does not depend on whether the memo is used (e.g. ALA's blend, keyed by its inputs).
    cache: dict = field(default_factory=dict)
    #: what one hook hands a later hook of the same exchange (FedFomo's weights from ``client_init`` to ``reply``):
    #: never state, never metrics, gone after the exchange
    scratch: dict = field(default_factory=dict)

    def tree_for(self, phase: str, rnd: int) -> SeedTree:
        """This client's streams for ``phase`` in round ``rnd`` (what the runtime hands that exchange)."""
        return client_tree(SeedTree(self.run.seed), phase, rnd, self.cid)

    @property
    def model(self) -> FedModel:
        return self.run.model

    @property
    def train(self) -> TrainConfig:
        return self.run.train


def server_tree(root: SeedTree, rnd: int) -> SeedTree:
    """The seed-tree node of the server's streams in round ``rnd`` (``ServerCtx.tree``)."""
    return root.child("server", "round", rnd)


def client_tree(root: SeedTree, phase: str, rnd: int, cid: int) -> SeedTree:
    """The seed-tree node of client ``cid``'s streams for ``phase`` (``"evaluate"`` -> ``"eval"``) in round ``rnd``."""
    return root.child("eval" if phase == "evaluate" else phase, "round", rnd, "client", cid)


@dataclass(frozen=True)
class NoOptions:
    pass


class ClientTransform:
    """A composable client-side part applied after ``client_init`` and before local training (e.g. ALA).

    ``apply`` returns the parameters to train from and the updated client state; a transform keeps its own
    state under ``cstate[self.key]``. ``after_train`` sees the trained parameters. ``eval_params`` may replace
    the personalized model evaluated, from the evaluation message and the client's state only; a transform
    that blends the received model (``requires_received``) is handed what ``client_init`` makes of the
    evaluation message, as ``apply`` is in training. ``eval_models`` may offer ``[eval] model`` choices of its
    own (ALA: "ala", "stored", "trained"), which then replace the host's.
    """

    name: ClassVar[str] = "transform"
    options_cls: ClassVar[type] = NoOptions
    #: the transform reads the client's own model from its last training (``cstate["params"]``)
    needs_local_model: ClassVar[bool] = False
    #: the transform blends with a global model, so the method must have one
    requires_global: ClassVar[bool] = False
    #: the transform blends the model the server sends a client (global or personalized: what ``client_init`` makes
    #: of the message) with the client's own last model, so the method must train from a received model
    #: (``traits.trains_from_received``); at evaluation it reads that model from the evaluation message
    requires_received: ClassVar[bool] = False
    #: the transform runs its own optimisation loop as plain code on the client (ALA's weight learning), so a
    #: backend that batches TrainSpecs across clients cannot batch that part
    own_loop: ClassVar[bool] = False
    #: prefixes of the client stats (``ctx.stats`` keys) the round's metrics also keep per client, in
    #: ``stats_per_client`` (ALA's per-round diagnostics): per-round records belong in the round's metrics, never
    #: in the client state, which is checkpointed and shipped every round and must not grow with the rounds
    per_client_stats: ClassVar[tuple[str, ...]] = ()

    def __init__(self, options: Any = None):
        self.opts = options if options is not None else self.options_cls()

    @property
    def key(self) -> str:
        return self.name

    def check_model(self, method: Method, model: FedModel) -> None:
        """Refuse options that do not fit ``model`` (a :class:`ConfigError` naming the field), before the run
        starts; called by :meth:`Method.check_model`."""

    def apply(self, method: Method, params: Params, cstate: State, ctx: ClientCtx) -> tuple[Params, State]:
        raise NotImplementedError

    def after_train(self, method: Method, params: Params, cstate: State, ctx: ClientCtx) -> State:
        return cstate

    def eval_params(self, method: Method, msg: Message, cstate: State, ctx: ClientCtx, params: Params) -> Params:
        return params

    def eval_models(self, method: Method, current: dict[str, str]) -> dict[str, str]:
        """The ``[eval] model`` choices (name -> what is then evaluated, the first the default) with this
        transform on; ``current``: the host's (default: unchanged)."""
        return current

    def eval_description(self, method: Method, current: str) -> str:
        """What the personalized accuracy evaluates with this transform on (``current``: without it)."""
        return current



def report_loss(ctx: ClientCtx, key: str, res: TrainResult) -> None:
    """Report a training phase's mean loss as the client stat ``key``, unless the phase trained no batch (fewer
    samples than one batch under ``train.drop_last``; PFLlib's loader skips such a client): its loss is undefined,
    and a NaN would read as a divergence."""
    if res.steps:
        ctx.stats[key] = res.mean_loss

class _Pretrainable:
    """``Method.pretrainable``, read from the class (``fedblend pretrain`` checks it before building anything):
    whether the class has a pre-training run, i.e. defines :meth:`Method.pretrain_options`."""

    def __get__(self, obj: Any, cls: type) -> bool:
        legacy = getattr(cls, "_legacy", {}).get("pretrainable")
        return bool(legacy) or cls.pretrain_options.__func__ is not Method.pretrain_options.__func__


class Method:
    """FedAvg behaviour by default; subclasses override the steps that differ (see module docstring).

    What the rest of fedblend reads about a method is ``self.traits`` (:class:`Traits`), resolved when the method
    is built from one function, :meth:`declare`, of its options and the ``[eval] model`` in force, and from its
    transforms; a method class declares nothing else as a class attribute (``tests/test_contract.py`` checks)."""

    name: ClassVar[str] = "method"
    options_cls: ClassVar[type] = NoOptions
    paper: ClassVar[str] = ""
    pretrainable = _Pretrainable()
    _legacy: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any):
        """A class attribute named after a trait would be silently ignored (the rest of fedblend reads
        ``self.traits``): one of the former declarations (:data:`LEGACY_DECLARATIONS`, a plug-in written before
        :meth:`declare`) is still honoured, with a FutureWarning naming ``declare``; any other trait's name is
        refused where the class is written."""
        super().__init_subclass__(**kwargs)
        body = vars(cls)
        stale = sorted(f.name for f in fields(Traits) if f.name in body and f.name not in LEGACY_DECLARATIONS)
        if stale:
            raise TypeError(f"{cls.__name__} defines {', '.join(stale)} as a class attribute, which nothing reads: "
                            f"declare it in declare(), e.g. def declare(self, choice): return "
                            f"replace(super().declare(choice), {stale[0]}=...)")
        if "resolve_traits" in body:
            raise TypeError(f"{cls.__name__} overrides resolve_traits, which is no longer a hook: declare its traits "
                            f"in declare(self, choice) -> Traits")
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

    # ----------------------------------------------------------------------------------------- helpers
    @property
    def label(self) -> str:
        return "+".join([self.name] + [t.name for t in self.transforms])

    def shared_names(self, run: RunInfo) -> list[str]:
        return list(run.init_params) if self.traits.shares == "all" else run.model.body_names()

    @classmethod
    def pretrain_options(cls, options: Mapping[str, Any]) -> dict:
        raise NotImplementedError(f"{cls.name} has no pre-training run")

    @classmethod
    def save_pretrained(cls, server: State, path: Any) -> Any:
        raise NotImplementedError(f"{cls.name} has no pre-training run")

    def phases(self, sctx: ServerCtx) -> Sequence[str]:
        """The exchanges of round ``sctx.rnd``, in order (default: one, ``"train"``)."""
        return ("train",)

    def check_model(self, model: FedModel) -> None:
        """Refuse options that do not fit ``model`` with a :class:`~fedblend.common.errors.ConfigError`; the
        engine calls it before the server half starts, so a bad value fails up front, not in round 1 on a
        client. The default asks the transforms."""
        for t in self.transforms:
            t.check_model(self, model)

    # ========================================================================================= server half
    def init_server(self, sctx: ServerCtx) -> State:
        return {"global": clone(sctx.run.init_params)}

    def configure(self, phase: str, server: State, cid: int, sctx: ServerCtx) -> Message:
        if phase == "train":
            return self.configure_train(server, cid, sctx)
        raise ValueError(f"{self.name} has no phase {phase!r}")

    def aggregate(self, phase: str, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        if phase == "train":
            return self.aggregate_train(server, replies, sctx)
        raise ValueError(f"{self.name} has no phase {phase!r}")

    def configure_train(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        return Message({"params": select(server["global"], self.shared_names(sctx.run))})

    def aggregate_train(self, server: State, replies: Mapping[int, Message], sctx: ServerCtx) -> State:
        """FedAvg (McMahan et al. 2017, Alg. 1): data-size-weighted mean of the uploaded parameters."""
        cids = sorted(replies)
        avg = weighted_average([replies[c].params() for c in cids], [replies[c].metrics["num_samples"] for c in cids])
        return {**server, "global": {**server["global"], **avg}}

    def global_params(self, server: State) -> Params | None:
        return server.get("global") if self.traits.reports_global else None

    def configure_evaluate(self, server: State, cid: int, sctx: ServerCtx) -> Message:
        """The evaluation message: what client ``cid`` would receive to train now (``"params"``), and the global
        model (``"global"``) where the method has one."""
        if self.traits.evaluates_own_model:
            return Message()
        msg = self.configure_train(server, cid, sctx)
        glob = self.global_params(server)
        if glob is not None:
            msg.arrays["global"] = glob
        return msg

    # ========================================================================================= client half
    def init_client(self, ctx: ClientCtx) -> State:
        return {"params": clone(ctx.run.init_params)} if self.traits.keeps_model else {}

    def client_step(self, phase: str, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        if phase == "train":
            return self.client_train(msg, cstate, ctx)
        raise ValueError(f"{self.name} has no phase {phase!r}")

    def client_init(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The received parameters over the client's own (a head that is not sent stays)."""
        return {**cstate.get("params", {}), **msg.params()}

    def apply_transforms(self, params: Params, cstate: State, ctx: ClientCtx) -> tuple[Params, State]:
        for t in self.transforms:
            params, cstate = t.apply(self, params, cstate, ctx)
        return params, cstate

    def loss_terms(self, msg: Message, params: Params, cstate: State, ctx: ClientCtx) -> tuple[LossTerm, ...]:
        """Extra terms of the training loss (none = plain cross-entropy)."""
        return ()

    def train_spec(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx, **kw) -> TrainSpec:
        """Local SGD from ``params`` with the configured epochs and lr, the kept momentum buffers when
        ``train.optimizer_state = "keep"``, and the method's loss terms; ``kw`` overrides spec fields."""
        keep = ctx.train.optimizer_state == "keep"
        spec = dict(params=params, momentum=cstate.get("momentum") if keep else None,
                    loss_terms=self.loss_terms(msg, params, cstate, ctx))
        return TrainSpec(**{**spec, **kw})

    def record_training(self, res: TrainResult, cstate: State, ctx: ClientCtx) -> State:
        """After a spec ran: keep the momentum buffers (merged, so untrained tensors keep theirs) and the loss. A
        client that trained no batch (fewer samples than one batch under ``train.drop_last``, as PFLlib's loader
        skips it) reports no ``train_loss``: its loss is undefined, not a divergence."""
        if ctx.train.optimizer_state == "keep" and res.momentum is not None:
            cstate = {**cstate, "momentum": merge_momentum(cstate.get("momentum"), res.momentum)}
        report_loss(ctx, "train_loss", res)
        return cstate

    # ---------------------------------------------------------------------------------- template hooks
    def before_training(self, msg: Message, cstate: State, ctx: ClientCtx) -> State:
        """Hook: client-side work before the client initialises its model (default: none)."""
        return cstate

    def scored_params(self, params: Params, msg: Message, cstate: State, ctx: ClientCtx) -> Params | EvalSpec:
        """Hook: the model that ``params`` stand for when scored before / after training: parameters, or an
        :class:`EvalSpec` (default: ``params``; DBE adds its representation bias in its forward)."""
        return params

    def local_training(self, params: Params, msg: Message, cstate: State,
                       ctx: ClientCtx) -> Generator[TrainSpec, TrainResult, tuple[TrainResult, State]]:
        """Hook, the template's training step: one spec (:meth:`train_spec`), then :meth:`record_training`. A
        method that trains in several specs (FedRep's head then body phases, Ditto's personalized model) or in a
        loop of its own overrides this and returns the result whose ``params`` are the client's trained model,
        and the updated state."""
        res = yield self.train_spec(params, msg, cstate, ctx)
        return res, self.record_training(res, cstate, ctx)

    def reply(self, res: TrainResult, msg: Message, cstate: State, ctx: ClientCtx) -> Message:
        """Hook: the training reply, from the trained model (``res.params``; ``res.extras`` holds what the
        method's ``local_training`` left for it): the shared parameters and ``num_samples``."""
        shared = select(res.params, self.shared_names(ctx.run))
        return Message({"params": shared}, {"num_samples": ctx.data.num_train})

    # ------------------------------------------------------------------------------ the client template
    def client_train(self, msg: Message, cstate: State, ctx: ClientCtx) -> ClientWork:
        """The client half of a training exchange (module docstring): closed, varied only through the hooks."""
        cstate = self.before_training(msg, cstate, ctx)
        params = self.client_init(msg, cstate, ctx)
        params, cstate = self.apply_transforms(params, cstate, ctx)
        self._score("bp", params, msg, cstate, ctx)
        res, cstate = yield from self.local_training(params, msg, cstate, ctx)
        self._score("ap", res.params, msg, cstate, ctx)
        if self.traits.keeps_model:
            cstate = {**cstate, "params": res.params}
        for t in self.transforms:
            cstate = t.after_train(self, res.params, cstate, ctx)
        return self.reply(res, msg, cstate, ctx), cstate

    def _score(self, tag: str, params: Params, msg: Message, cstate: State, ctx: ClientCtx) -> None:
        if msg.config.get(BEFORE_AFTER):
            score_before_after(tag, self.scored_params(params, msg, cstate, ctx), msg, ctx)

    # ----------------------------------------------------------------------------------------- evaluation
    def personalized_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """The method's own personalized model of the client: its model after local training, or what it would
        start training from (``evaluates_received_model``)."""
        return self.client_init(msg, cstate, ctx) if self.traits.evaluates_received_model else cstate["params"]

    def eval_params(self, msg: Message, cstate: State, ctx: ClientCtx) -> Params:
        """Parameters of the client's personalized model, per ``[eval] model`` (``traits.eval_choice``): the
        method's :meth:`personalized_params`, then each transform's ``eval_params`` on top. A transform that
        blends the received model (ALA) replaces the method's choice by its own: the template then hands it
        what ``client_init`` makes of the evaluation message, as training hands ``apply``. A method whose
        transforms do not change the model evaluated (``Traits.eval_transforms``: Ditto's v_k) is its own."""
        if not self.traits.eval_transforms:
            return self.personalized_params(msg, cstate, ctx)
        if any(t.requires_received for t in self.transforms):
            params = self.client_init(msg, cstate, ctx)
        else:
            params = self.personalized_params(msg, cstate, ctx)
        for t in self.transforms:
            params = t.eval_params(self, msg, cstate, ctx, params)
        return params

    def evaluate(self, msg: Message, cstate: State, ctx: ClientCtx) -> EvalSpec:
        """The client's personalized model as an :class:`EvalSpec`: :meth:`eval_params` with the model's own
        forward pass; a method that classifies otherwise (FedProto's nearest prototype, DBE's bias) returns its
        own forward."""
        return EvalSpec(self.eval_params(msg, cstate, ctx))


def legacy_traits(method: Method) -> dict[str, Any]:
    """The traits a plug-in still declares as class attributes (:data:`LEGACY_DECLARATIONS`), as :class:`Traits`
    fields: they override what ``declare`` returns, as a subclass's attribute overrode its base's."""
    return {LEGACY_DECLARATIONS[k]: (tuple(v) if isinstance(v, list) else v)
            for k, v in method._legacy.items() if LEGACY_DECLARATIONS[k]}


def own_eval_models(method: Method) -> dict[str, str]:
    """The method's :meth:`~Method.eval_models`; a plug-in's former ``eval_model`` class attribute describes its
    first choice, and its former ``evaluates_received_model`` names a single choice "received" or "trained" (as
    the default ``eval_models`` did)."""
    own = dict(method.eval_models())
    legacy = method._legacy
    if len(own) == 1 and "evaluates_received_model" in legacy:
        own = {"received" if legacy["evaluates_received_model"] else "trained": next(iter(own.values()))}
    if "eval_model" in legacy and own:
        own[next(iter(own))] = legacy["eval_model"]
    return own


def eval_choices(method: Method) -> dict[str, str]:
    """The ``[eval] model`` choices of a built method: its :meth:`~Method.eval_models` composed with its
    transforms' (ALA offers its own, which replace the host's), unless its transforms do not change the model
    evaluated (``Traits.eval_transforms``). Reads ``method.traits`` for the facts no choice changes."""
    choices = own_eval_models(method)
    if method.traits.eval_transforms:
        for t in method.transforms:
            choices = dict(t.eval_models(method, choices))
    return choices


def resolve_traits(method: Method, request: str | None = None) -> Traits:
    """The built method's :class:`Traits` under ``[eval] model = request`` (None: the first choice, the method's
    paper's): its :meth:`~Method.declare` of that choice, what it leaves open resolved (None fields, the
    evaluation description), composed with the transforms (a transform's model need, own loop, per-client stats
    and evaluation description). While the choices are composed, ``method.traits`` holds the declaration of the
    method's default choice, so a transform can word its choices after the host (ALA: ``global_model``)."""
    own = own_eval_models(method)
    if not own:
        raise TypeError(f"{type(method).__name__}.eval_models() offers no [eval] model")
    method.traits = replace(method.declare(next(iter(own))), **legacy_traits(method))
    choices = eval_choices(method)
    choice = request or next(iter(choices))
    if choice not in choices:
        raise ValueError(f"{method.label}: eval.model = {choice!r} is not one of its choices: "
                         f"{', '.join(repr(c) for c in choices)}")
    t = method.declare(choice)
    if not isinstance(t, Traits):
        raise TypeError(f"{type(method).__name__}.declare() returned a {type(t).__name__}, not Traits")
    t = replace(t, **legacy_traits(method))
    if t.per_client_stats or t.eval_choice:
        raise TypeError(f"{type(method).__name__}.declare() sets per_client_stats or eval_choice, which are "
                        f"resolved from the transforms and the [eval] model, not declared")
    desc = choices[choice]
    if t.eval_transforms:
        for tr in method.transforms:
            desc = tr.eval_description(method, desc)
    glob = t.global_model
    # a transform that blends the received model evaluates that blend from the evaluation message, which must
    # then carry the model (a method that evaluates its own model otherwise sends nothing)
    blends = any(tr.requires_received for tr in method.transforms)
    return replace(
        t, eval_model=t.eval_model.replace("{}", desc), eval_choice=choice,
        reports_global=glob if t.reports_global is None else t.reports_global,
        trains_from_received=glob if t.trains_from_received is None else t.trains_from_received,
        evaluates_received_model=(choice == "received" if t.evaluates_received_model is None
                                  else t.evaluates_received_model),
        evaluates_own_model=t.evaluates_own_model and not blends,
        keeps_model=t.keeps_model or any(tr.needs_local_model for tr in method.transforms),
        own_loop=t.own_loop or any(tr.own_loop for tr in method.transforms),
        param_records=tuple(t.param_records), extra_entries=tuple(t.extra_entries),
        per_client_stats=tuple(p for tr in method.transforms for p in tr.per_client_stats))


BEFORE_AFTER = "before_after_split"  # message config key: score the model before ("bp") and after ("ap") training


@torch.no_grad()
def score_before_after(tag: str, params: Params | EvalSpec, msg: Message, ctx: ClientCtx) -> None:
    """When the message asks for it (``config["before_after_split"]``, set by the engine under
    ``eval.before_after``), count the correct predictions of ``params`` on that split of the client's data into
    ``ctx.stats[tag + "_correct"]`` / ``[tag + "_n"]``; the engine pools them into ``{tag}_acc``. ``"bp"``: the
    model a client trains from (received, after transforms), ``"ap"``: after local training (pFedRLLA Table 2)."""
    split = msg.config.get(BEFORE_AFTER)
    if not split:
        return
    x, y = getattr(ctx.data, f"{split}_x"), getattr(ctx.data, f"{split}_y")
    c, _, n = evaluate_params(ctx.model, as_eval_spec(params), x, y)
    ctx.stats[f"{tag}_correct"], ctx.stats[f"{tag}_n"] = c, n


def train_now(spec: TrainSpec, ctx: ClientCtx) -> TrainResult:
    """Run a spec at once on the client's own data and stream (for evaluation-time work such as fine-tuning,
    which is not part of the round's training)."""
    return run_spec(spec, ctx.model, ctx.data, ctx.train, ctx.tree.torch(spec.stream))


def same_tensors(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor] | None) -> bool:
    """Whether two parameter dicts hold the very same tensor objects (so evaluating one evaluates both)."""
    return b is not None and a.keys() == b.keys() and all(a[k] is b[k] for k in a)
