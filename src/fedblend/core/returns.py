"""What each hook must return, checked where fedblend receives it: one table, read from the return annotations of
the hooks' own signatures (:class:`~fedblend.core.method.ServerHalf`, :class:`~fedblend.core.method.ClientHalf`
and :class:`~fedblend.core.method.Method`: every name in their ``HOOKS``; the method module registers them,
:func:`register`), and one check, :func:`returned` (:func:`returned_result` for a generator's final value).

A hook that returns the wrong kind of object -- ``before_training`` a tuple, ``loss_terms`` a dict, ``configure_train``
the bare parameters, ``declare`` a dict, ``phases`` one phase's name -- is named at that hook, with what it returned
and what it must return (``"<plug-in>: loss_terms returned a dict, not a tuple of LossTerms (client 2, round 1)"``,
a :class:`~fedblend.common.errors.HookError`), not as an AttributeError in the hook or the engine line that next
touches the value, and never accepted. The call sites: the engine and a round's exchanges (the server half's
hooks), the client runtime and the vmap driver (``init_client``, ``client_step``, ``evaluate``), the client
template (:mod:`fedblend.core.template`: ``before_training``, ``client_init``, ``loss_terms``, ``local_training``,
``scored_params``, ``reply``, ``personalized_params``), the default routers of :class:`ServerHalf` (``configure`` ->
``configure_train``, ``aggregate`` -> ``aggregate_train``) and ``evaluate`` (``eval_params``), and the traits'
resolution (``declare``, ``eval_models``). A check is one ``isinstance`` (and, for a sequence, one per element);
what a right type holds (a model's names and shapes, a reply's entries) is the reply contract's
(:mod:`fedblend.core.replies`) and the engine's.
"""

from __future__ import annotations

import collections.abc as abc
import types
import typing
from dataclasses import dataclass
from typing import Any

from fedblend.common.guard import returned_wrong

#: how an error names a return annotation's type (the annotation as written in the hook's signature); ``{}``: the
#: server's or the client's, by the hook's half
WHAT = {
    "State": "the {} state (a dict)",
    "Params": "parameters (a dict of tensors)",
    "Message": "a Message",
    "Sequence[str]": "a non-empty sequence of phase names (a tuple of str)",
    "tuple[LossTerm, ...]": "a tuple of LossTerms",
    "Params | EvalSpec": "parameters (a dict of tensors) or an EvalSpec",
    "EvalSpec": "an EvalSpec",
    "Traits": "Traits",
    "TransformTraits": "TransformTraits",
    "tuple[Params, State]": "a tuple (parameters, client state)",
    "str": "a str",
    "dict[str, str]": "a dict of [eval] model choices (name -> description)",
    "ClientWork": "a generator of TrainSpecs (a function that yields)",
    "Generator[TrainSpec, TrainResult, tuple[TrainResult, State]]": "a generator of TrainSpecs (a function that "
                                                                   "yields)",
}
#: the hooks whose sequence must not be empty (a round of no exchange)
NONEMPTY = frozenset({"phases"})


@dataclass(frozen=True)
class Contract:
    """What a hook returns: an instance of ``types``, whose elements (a sequence's) are instances of ``items``
    where that is not None; a generator's final value a tuple of instances of ``result``'s types; ``what``: how
    an error names it."""

    types: tuple[type, ...]
    what: str
    items: tuple[type, ...] | None = None
    result: tuple[tuple[type, ...], ...] | None = None
    nonempty: bool = False
    positions: tuple[tuple[type, ...], ...] | None = None  # a fixed-length tuple's, per position (``tuple[Params, State]``)


_TABLE: dict[str, Contract] = {}
#: a client transform's hooks (:class:`~fedblend.core.transform.ClientTransform`'s ``HOOKS``), checked by
#: :func:`transform_returned`
_TRANSFORM_TABLE: dict[str, Contract] = {}


def register(server: type, client: type, method: type) -> None:
    """Read the contracts of every hook in the ``HOOKS`` of the method interface's classes (the server half, the
    client half and the method: :mod:`fedblend.core.method` registers them where it defines them)."""
    for half in (server, client, method):
        for hook in half.HOOKS:
            _TABLE[hook] = _contract(method, hook, "server" if half is server else "client")


def register_transform(transform: type) -> None:
    """Read the contracts of a client transform's hooks (``transform.HOOKS``; :mod:`fedblend.core.transform`
    registers :class:`~fedblend.core.transform.ClientTransform` where it defines it)."""
    for hook in transform.HOOKS:
        _TRANSFORM_TABLE[hook] = _contract(transform, hook, "client")


def contracts(transform: bool = False) -> dict[str, Contract]:
    """hook -> :class:`Contract`, for every hook of the method interface (``transform``: of a client
    transform)."""
    return _TRANSFORM_TABLE if transform else _TABLE


def _contract(cls: type, hook: str, half: str) -> Contract:
    fn = getattr(cls, hook)
    hint = typing.get_type_hints(fn)["return"]
    written = fn.__annotations__["return"]
    what = WHAT.get(written, written).format(half)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is abc.Generator:
        return Contract((abc.Generator,), what, result=tuple(_classes(a) for a in typing.get_args(args[2])))
    if origin is tuple and args and args[-1] is not Ellipsis:  # a fixed-length tuple
        return Contract((tuple,), what, positions=tuple(_classes(a) for a in args))
    items = _classes(args[0]) if origin in (tuple, abc.Sequence) and args else None
    return Contract(_classes(hint), what, items, nonempty=hook in NONEMPTY)


def _classes(hint: Any) -> tuple[type, ...]:
    """The classes an annotation's values are instances of: a union's members', a generic's origin (a sequence:
    a list or a tuple, never a str), ``object`` for ``Any``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return tuple(c for a in typing.get_args(hint) for c in _classes(a))
    if origin in (tuple, abc.Sequence):
        return (list, tuple)
    if origin is not None:
        return (origin,)
    return (object,) if hint is Any else (hint,)


def returned(owner: Any, hook: str, value: Any, rnd: int | None = None, cid: int | None = None) -> Any:
    """``value``, what ``owner``'s ``hook`` returned (in round ``rnd``, 0-based, for client ``cid``), where it is
    what the hook must return (its :class:`Contract`); else the :class:`~fedblend.common.errors.HookError` that
    names the plug-in, the hook, the round, the client, what it returned and what it must return."""
    return _checked(_TABLE[hook], "method", owner, hook, value, rnd, cid)


def transform_returned(owner: Any, hook: str, value: Any, rnd: int | None = None, cid: int | None = None) -> Any:
    """:func:`returned` for a client transform's hook (``apply``, ``after_train``, ``eval_params``,
    ``eval_models``, ``eval_description``, ``declare``): the error names the transform."""
    return _checked(_TRANSFORM_TABLE[hook], "transform", owner, hook, value, rnd, cid)


def _checked(c: Contract, kind: str, owner: Any, hook: str, value: Any, rnd: int | None, cid: int | None) -> Any:
    if isinstance(value, c.types) and (c.items is None or _items_ok(value, c)) and _positions_ok(value, c):
        return value
    returned_wrong(owner, kind, hook, f"{_what(value, c)}, not {c.what}", rnd, cid)


def _items_ok(value: Any, c: Contract) -> bool:
    return (len(value) > 0 or not c.nonempty) and all(isinstance(v, c.items) for v in value)


def _positions_ok(value: Any, c: Contract) -> bool:
    return c.positions is None or (len(value) == len(c.positions)
                                   and all(isinstance(v, p) for v, p in zip(value, c.positions)))


def _what(value: Any, c: Contract | None = None) -> str:
    if value is None:
        return "None (a missing return?)"
    if c is not None and c.items is not None and isinstance(value, c.types):
        bad = [v for v in value if not isinstance(v, c.items)]
        inner = "nothing" if not value else "None" if bad[0] is None else _what(bad[0])
        return f"a {type(value).__name__} holding {inner}"
    return f"a {type(value).__name__}"


def returned_result(owner: Any, hook: str, value: Any, rnd: int | None = None, cid: int | None = None) -> Any:
    """``value``, the final value of the generator ``owner``'s ``hook`` returned, where it is the tuple its
    contract names (``client_step``: ``(reply Message, state)``; ``local_training``: ``(TrainResult, state)``);
    else the :class:`~fedblend.common.errors.HookError` naming the hook (see :func:`returned`)."""
    parts = _TABLE[hook].result or ()
    if isinstance(value, tuple) and len(value) == len(parts) and all(isinstance(v, p) for v, p in zip(value, parts)):
        return value
    want = ", ".join("state" if p == (dict,) else p[0].__name__ for p in parts)
    got = _what(value) if not isinstance(value, tuple) else "(" + ", ".join(_what(v) for v in value) + ")"
    returned_wrong(owner, "method", hook, f"a generator whose return value is {got}, not ({want})", rnd, cid)
