"""Client transforms: composable client-side parts a method runs after ``client_init`` and before local
training (ALA, FedALA Eq. 4-6: ``method = "fedavg+ala"``), and ``NoOptions``, the options of a method or transform
without any. Importable from :mod:`fedblend.core.method` as well."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from fedblend.common.params import Params
from fedblend.core.context import ClientCtx, State
from fedblend.core.message import Message
from fedblend.core.returns import register_transform, transform_returned
from fedblend.core.traits import TRANSFORM_LEGACY, TransformTraits
from fedblend.models.zoo import FedModel

#: the host method (a :class:`fedblend.core.method.Method`; named by annotation only, as method.py imports this module)
Method = Any


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
    own (ALA: "ala", "stored", "trained"), which then replace the host's. What it needs of its host is one
    function of its options, :meth:`declare` -> :class:`~fedblend.core.traits.TransformTraits`.
    """

    name: ClassVar[str] = "transform"
    options_cls: ClassVar[type] = NoOptions
    #: the hooks a transform overrides; what each returns is checked where fedblend receives it
    #: (:func:`fedblend.core.returns.transform_returned`, read from these signatures)
    HOOKS: ClassVar[tuple[str, ...]] = ("declare", "apply", "after_train", "eval_params", "eval_models",
                                        "eval_description")
    _legacy: ClassVar[dict[str, Any]] = {}

    def __init_subclass__(cls, **kwargs: Any):
        """A plug-in that still declares its needs as class attributes (:data:`TRANSFORM_LEGACY`) is honoured,
        with a FutureWarning naming ``declare``."""
        super().__init_subclass__(**kwargs)
        old = {k: v for k, v in vars(cls).items() if k in TRANSFORM_LEGACY}
        if old:
            warnings.warn(f"{cls.__name__} declares {', '.join(sorted(old))} as class attributes; declare them in "
                          f"def declare(self) -> TransformTraits (" + ", ".join(
                              f"{k} -> TransformTraits.{TRANSFORM_LEGACY[k]}" for k in sorted(old))
                          + "); class attributes stop working in a later release", FutureWarning, stacklevel=2)
            cls._legacy = {**cls._legacy, **{TRANSFORM_LEGACY[k]: tuple(v) if isinstance(v, list) else v
                                             for k, v in old.items()}}

    def __init__(self, options: Any = None):
        self.opts = options if options is not None else self.options_cls()

    def declare(self) -> TransformTraits:
        """What the transform needs of its host, from its options (default: nothing)."""
        return TransformTraits()

    @property
    def traits(self) -> TransformTraits:
        """:meth:`declare`'s value (with a plug-in's former class attributes on top)."""
        return replace(transform_returned(self, "declare", self.declare()), **self._legacy)

    @property
    def key(self) -> str:
        """Where the transform keeps its state in the client state: ``cstate[self.key]`` (its name)."""
        return self.name

    def check_model(self, method: Method, model: FedModel) -> None:
        """Refuse options that do not fit ``model`` (a :class:`~fedblend.common.errors.ConfigError` naming the
        field), before the run starts; called by :meth:`fedblend.core.method.Method.check_model`."""

    def apply(self, method: Method, params: Params, cstate: State, ctx: ClientCtx) -> tuple[Params, State]:
        """Called by the template after ``client_init``: the parameters to train from, and the client state."""
        raise NotImplementedError

    def after_train(self, method: Method, params: Params, cstate: State, ctx: ClientCtx) -> State:
        """Called after local training with the trained parameters; returns the client state (default: unchanged)."""
        return cstate

    def eval_params(self, method: Method, msg: Message, cstate: State, ctx: ClientCtx, params: Params) -> Params:
        """The parameters evaluated with this transform on, from the host's ``params`` (default: unchanged)."""
        return params

    def eval_models(self, method: Method, current: dict[str, str]) -> dict[str, str]:
        """The ``[eval] model`` choices (name -> what is then evaluated, the first the default) with this
        transform on; ``current``: the host's (default: unchanged)."""
        return current

    def eval_description(self, method: Method, current: str) -> str:
        """What the personalized accuracy evaluates with this transform on (``current``: without it)."""
        return current


register_transform(ClientTransform)  # what each hook returns, read from the signatures above
