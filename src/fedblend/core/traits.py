"""What the rest of fedblend knows about a built method: its :class:`Traits`, and how they are resolved.

A method declares its traits in one function of its options and the ``[eval] model`` in force,
:meth:`~fedblend.core.method.Method.declare`; :func:`resolve_traits` completes that declaration (what it leaves
open, the evaluation description) and composes the method's client transforms into it when the method is built.
The engine, the runtimes, the registry and the reports read only ``method.traits``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from fedblend.core.returns import returned, transform_returned

Method = Any  # a fedblend.core.method.Method (not imported: the method module imports this one)

__all__ = ["LEGACY_DECLARATIONS", "TRAINED", "TRANSFORM_LEGACY", "TransformTraits", "Traits", "eval_choices",
           "resolve_traits"]


@dataclass(frozen=True)
class Traits:
    """What the engine, the runtimes, the registry and the reports know about a built method: one frozen value,
    one name per concept. A method *declares* it in one function of its options and the ``[eval] model`` in force,
    :meth:`~fedblend.core.method.Method.declare` (``return Traits(shares="body")``); building the method resolves
    what is left open (a None below, the evaluation description) and composes its transforms
    (:func:`resolve_traits`). Nothing reads a method's behaviour flags anywhere else."""

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
    #: prefixes of the client stats (``ctx.stats`` keys) the round's metrics also keep per client, in
    #: ``stats_per_client``, besides their mean over the selected clients (e.g. APFL's learned ``apfl_alpha``)
    client_stats: tuple[str, ...] = ()
    #: what the reported personalized accuracy evaluates, written into every result: declared, a template in which
    #: ``{}`` stands for the description of the ``[eval] model`` in force (:meth:`Method.eval_models`, composed
    #: with the transforms'), e.g. FedAvg-FT's ``"{}; then fine-tuned ..."``; resolved, the description itself
    eval_model: str = "{}"
    #: resolved, never declared: prefixes of the client stats the engine records per client
    #: (``stats_per_client`` of the round's metrics) besides their mean over the selected clients: the method's
    #: ``client_stats`` and the transforms'
    per_client_stats: tuple[str, ...] = ()
    #: resolved, never declared: the ``[eval] model`` in force, one of :meth:`Method.eval_choices`
    eval_choice: str = ""


#: the class attributes that declared a method's traits before
#: :meth:`~fedblend.core.method.Method.declare` (a plug-in that still sets
#: them is built with a FutureWarning): old name -> the :class:`Traits` field ("" where it is not a field)
LEGACY_DECLARATIONS = {
    "eval_model": "", "shares": "shares", "has_global": "global_model",
    "trains_from_received": "trains_from_received", "client_keeps_model": "keeps_model",
    "client_own_loop": "own_loop", "accepts_transforms": "accepts_transforms",
    "evaluates_received_model": "evaluates_received_model", "evaluates_own_model": "evaluates_own_model",
    "pretrainable": "", "param_records": "param_records", "extra_entries": "extra_entries",
}
@dataclass(frozen=True)
class TransformTraits:
    """What a client transform needs of the method it composes with: one frozen value from
    :meth:`~fedblend.core.method.ClientTransform.declare`, one function of the transform's options."""

    #: it reads the client's own model from its last training (``cstate["params"]``): the host keeps it
    needs_local_model: bool = False
    #: it blends the model the server sends a client (global or personalized: what ``client_init`` makes of the
    #: message) with the client's own last model, so the host must train from a received model
    #: (``Traits.trains_from_received``); at evaluation it reads that model from the evaluation message
    requires_received: bool = False
    #: it runs an optimisation loop of its own as plain code on the client (ALA's weight learning), so a backend
    #: that batches TrainSpecs across clients cannot batch that part
    own_loop: bool = False
    #: prefixes of the client stats (``ctx.stats`` keys) the round's metrics also keep per client, in
    #: ``stats_per_client`` (ALA's per-round diagnostics): per-round records belong in the round's metrics, never
    #: in the client state, which is checkpointed and shipped every round and must not grow with the rounds
    per_client_stats: tuple[str, ...] = ()


#: the class attributes that declared a transform's needs before ``ClientTransform.declare`` (a plug-in that
#: still sets them is built with a FutureWarning): old name -> the :class:`TransformTraits` field. The former
#: ``requires_global`` (never set by a transform) asked for a global model to blend: a received one, now
TRANSFORM_LEGACY = {"needs_local_model": "needs_local_model", "requires_received": "requires_received",
                    "requires_global": "requires_received", "own_loop": "own_loop",
                    "per_client_stats": "per_client_stats"}

#: what a method evaluates unless it says otherwise (:meth:`Method.eval_models`)
TRAINED = "each client's model after its last local training"


def legacy_traits(method: Method) -> dict[str, Any]:
    """The traits a plug-in still declares as class attributes (:data:`LEGACY_DECLARATIONS`), as :class:`Traits`
    fields: they override what ``declare`` returns, as a subclass's attribute overrode its base's."""
    return {LEGACY_DECLARATIONS[k]: (tuple(v) if isinstance(v, list) else v)
            for k, v in method._legacy.items() if LEGACY_DECLARATIONS[k]}


def own_eval_models(method: Method) -> dict[str, str]:
    """The method's :meth:`~fedblend.core.method.Method.eval_models`; a plug-in's former ``eval_model`` class
    attribute describes its first choice, and its former ``evaluates_received_model`` names a single choice
    "received" or "trained" (as the default ``eval_models`` did)."""
    own = dict(returned(method, "eval_models", method.eval_models()))
    legacy = method._legacy
    if len(own) == 1 and "evaluates_received_model" in legacy:
        own = {"received" if legacy["evaluates_received_model"] else "trained": next(iter(own.values()))}
    if "eval_model" in legacy and own:
        own[next(iter(own))] = legacy["eval_model"]
    return own


def eval_choices(method: Method) -> dict[str, str]:
    """The ``[eval] model`` choices of a built method: its :meth:`~fedblend.core.method.Method.eval_models` composed with its
    transforms' (ALA offers its own, which replace the host's), unless its transforms do not change the model
    evaluated (``Traits.eval_transforms``). Reads ``method.traits`` for the facts no choice changes."""
    choices = own_eval_models(method)
    if method.traits.eval_transforms:
        for t in method.transforms:
            choices = dict(transform_returned(t, "eval_models", t.eval_models(method, choices)))
    return choices


def resolve_traits(method: Method, request: str | None = None) -> Traits:
    """The built method's :class:`Traits` under ``[eval] model = request`` (None: the first choice, the method's
    paper's): its :meth:`~fedblend.core.method.Method.declare` of that choice, what it leaves open resolved (None fields, the
    evaluation description), composed with the transforms (a transform's model need, own loop, per-client stats
    after the method's own ``client_stats``, and evaluation description). While the choices are composed,
    ``method.traits`` holds the declaration of the method's default choice, so a transform can word its choices
    after the host (ALA: ``global_model``)."""
    own = own_eval_models(method)
    if not own:
        raise TypeError(f"{type(method).__name__}.eval_models() offers no [eval] model")
    method.traits = replace(returned(method, "declare", method.declare(next(iter(own)))), **legacy_traits(method))
    choices = eval_choices(method)
    choice = request or next(iter(choices))
    if choice not in choices:
        raise ValueError(f"{method.label}: eval.model = {choice!r} is not one of its choices: "
                         f"{', '.join(repr(c) for c in choices)}")
    t = replace(returned(method, "declare", method.declare(choice)), **legacy_traits(method))
    if t.per_client_stats or t.eval_choice:
        raise TypeError(f"{type(method).__name__}.declare() sets per_client_stats or eval_choice, which are "
                        f"resolved from the transforms and the [eval] model, not declared (a method's own per-client "
                        f"stats: client_stats)")
    desc = choices[choice]
    if t.eval_transforms:
        for tr in method.transforms:
            desc = transform_returned(tr, "eval_description", tr.eval_description(method, desc))
    glob = t.global_model
    # a transform that blends the received model evaluates that blend from the evaluation message, which must
    # then carry the model (a method that evaluates its own model otherwise sends nothing)
    blends = any(tr.traits.requires_received for tr in method.transforms)
    return replace(
        t, eval_model=t.eval_model.replace("{}", desc), eval_choice=choice,
        reports_global=glob if t.reports_global is None else t.reports_global,
        trains_from_received=glob if t.trains_from_received is None else t.trains_from_received,
        evaluates_received_model=(choice == "received" if t.evaluates_received_model is None
                                  else t.evaluates_received_model),
        evaluates_own_model=t.evaluates_own_model and not blends,
        keeps_model=t.keeps_model or any(tr.traits.needs_local_model for tr in method.transforms),
        own_loop=t.own_loop or any(tr.traits.own_loop for tr in method.transforms),
        param_records=tuple(t.param_records), extra_entries=tuple(t.extra_entries),
        client_stats=tuple(t.client_stats),
        per_client_stats=tuple(t.client_stats) + tuple(p for tr in method.transforms for p in tr.traits.per_client_stats))
