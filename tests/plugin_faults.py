"""A plug-in method whose mistakes are chosen by its options, as a researcher's one-file plug-in would make them
(``method = "tests.plugin_faults:Faulty"`` in a config; module level, so worker processes import it too).

``options.hook`` names the hook that goes wrong, ``options.fault`` how, ``options.round`` (0-based) and
``options.client`` (-1: every client) when. The faults (:data:`FAULTS`):

* ``raise``: the hook raises ``ValueError("planted fault")``;
* ``none``: the hook returns None (a missing ``return``);
* ``type``: the hook returns its value wrapped in a list (the wrong kind of object);
* ``wrongtype``: the hook returns a plausible wrong kind of object of its own (``tests/wrong_returns.py``'s
  :data:`~tests.wrong_returns.WRONG`: ``configure_train`` the bare parameters, ``aggregate_train`` a
  ``(state, metrics)`` pair, ``loss_terms`` a dict of terms, ``before_training`` ``(message, state)``, ...);
* ``shape`` / ``dtype`` / ``nan``: the first model parameter in what the hook returns gets a wrong shape, an
  integer dtype or NaN values;
* ``extra`` / ``missing``: a parameter the model does not have added / the first parameter left out;
* ``zero``: the reply's ``num_samples`` is 0;
* ``signature``: the hook is replaced by a function with one parameter too few (called the way fedblend calls it,
  it raises ``TypeError``).

:attr:`Faulty.fired` is set (in the process that ran it) when the fault was applied (a hook whose value has no
model parameters to spoil, or no ``num_samples``, runs unchanged).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedblend.algorithms.fedavg import FedAvg
from fedblend.core.message import Message
from fedblend.core.training import LossTerm
from tests.wrong_returns import WRONG, WrongOptions

#: the hooks a fault can be planted in (``__init__``: the plug-in's construction)
HOOKS = ("__init__", "init_server", "phases", "configure_train", "aggregate_train", "configure_evaluate",
         "init_client", "before_training", "client_init", "loss_terms", "reply", "eval_params")
FAULTS = ("raise", "none", "type", "wrongtype", "shape", "dtype", "nan", "extra", "missing", "zero", "signature")
#: the faults in what a hook returns: once applied, the run stops naming the hook that returned it
RETURN_FAULTS = ("none", "type", "wrongtype")


@dataclass
class FaultOptions(WrongOptions):
    fault: str = ""


class Faulty(FedAvg):
    """FedAvg with one planted fault (module docstring)."""

    name = "faulty-plugin"
    options_cls = FaultOptions
    fired = False

    def __init__(self, options=None, transforms=None):
        super().__init__(options, transforms)
        o = self.opts
        if o.hook == "__init__" and o.fault in ("raise", "signature"):
            raise RuntimeError("planted fault")  # (a ValueError is how a constructor refuses options: exit 2)
        if o.fault == "signature" and o.hook in HOOKS:
            setattr(self, o.hook, lambda only_one: None)  # too few parameters for every hook: TypeError at the call

    # ------------------------------------------------------------------------------------------ the fault
    def _now(self, hook: str, rnd: int, cid: int | None) -> bool:
        o = self.opts
        return o.hook == hook and o.round == rnd and (cid is None or o.client < 0 or o.client == cid)

    def _spoil(self, hook: str, value, rnd: int, cid: int | None = None, *args):
        if not self._now(hook, rnd, cid):
            return value
        fault = self.opts.fault
        if fault in ("raise", *RETURN_FAULTS):
            type(self).fired = True
            if fault == "raise":
                raise ValueError("planted fault")
            return None if fault == "none" else [value] if fault == "type" else WRONG[hook][0](value, *args)
        if fault == "zero":
            if isinstance(value, Message) and "num_samples" in value.metrics:
                value.metrics["num_samples"] = 0
                type(self).fired = True
            return value
        params = _params_in(value)
        if params is None or not params or fault not in ("shape", "dtype", "nan", "extra", "missing"):
            return value  # nothing of this kind to spoil here: the hook runs as it is
        type(self).fired = True
        first = next(iter(params))
        t = params[first]
        if fault == "shape":
            params[first] = t.reshape(-1)[:1].clone() if t.numel() > 1 else torch.zeros(2)
        elif fault == "dtype":
            params[first] = t.round().long()
        elif fault == "nan":
            params[first] = torch.full_like(t, math.nan)
        elif fault == "extra":
            params["bogus"] = torch.zeros(3)
        elif fault == "missing":
            del params[first]
        return value

    # ------------------------------------------------------------------------------------------ hooks
    def init_server(self, sctx):
        return self._spoil("init_server", super().init_server(sctx), 0)

    def phases(self, sctx):
        out = super().phases(sctx)
        if self._now("phases", sctx.rnd, None) and self.opts.fault not in ("raise", *RETURN_FAULTS, "signature"):
            type(self).fired = True
            return ("train", "nosuch")  # a phase the method does not have
        return self._spoil("phases", out, sctx.rnd)

    def configure_train(self, server, cid, sctx):
        return self._spoil("configure_train", super().configure_train(server, cid, sctx), sctx.rnd, cid)

    def aggregate_train(self, server, replies, sctx):
        return self._spoil("aggregate_train", super().aggregate_train(server, replies, sctx), sctx.rnd)

    def configure_evaluate(self, server, cid, sctx):
        return self._spoil("configure_evaluate", super().configure_evaluate(server, cid, sctx), sctx.rnd, cid)

    def init_client(self, ctx):
        return self._spoil("init_client", super().init_client(ctx), ctx.rnd, ctx.cid)

    def before_training(self, msg, cstate, ctx):
        return self._spoil("before_training", super().before_training(msg, cstate, ctx), ctx.rnd, ctx.cid, msg)

    def client_init(self, msg, cstate, ctx):
        return self._spoil("client_init", super().client_init(msg, cstate, ctx), ctx.rnd, ctx.cid, msg)

    def loss_terms(self, msg, params, cstate, ctx):
        if self._now("loss_terms", ctx.rnd, ctx.cid) and self.opts.fault in ("shape", "nan", "dtype"):
            type(self).fired = True  # a loss term that breaks inside training (its own code, run by the trainer)
            return (LossTerm(_BAD_TERMS[self.opts.fault]),)
        return self._spoil("loss_terms", super().loss_terms(msg, params, cstate, ctx), ctx.rnd, ctx.cid)

    def reply(self, res, msg, cstate, ctx):
        return self._spoil("reply", super().reply(res, msg, cstate, ctx), ctx.rnd, ctx.cid)

    def eval_params(self, msg, cstate, ctx):
        out = super().eval_params(msg, cstate, ctx)
        if self._now("eval_params", ctx.rnd, ctx.cid) and isinstance(out, dict):
            out = dict(out)  # never the client's own state (evaluation must not change it)
        return self._spoil("eval_params", out, ctx.rnd, ctx.cid)


def _shape_term(params, batch):
    return torch.ones(2, 3) @ torch.ones(2, 3)  # a matmul of mismatched shapes: RuntimeError


def _nan_term(params, batch):
    return next(iter(params.values())).sum() * math.nan


def _dtype_term(params, batch):
    return torch.ones(1, dtype=torch.long).sum()  # an integer loss: backward refuses it


_BAD_TERMS = {"shape": _shape_term, "nan": _nan_term, "dtype": _dtype_term}


def _params_in(value):
    """The model-parameter dict inside ``value`` (a Message's ``params`` record, a state's ``global`` or
    ``params``, or a parameter dict itself), copied into place so that changing it changes ``value`` only."""
    if isinstance(value, Message):
        rec = value.arrays.get("params")
        if isinstance(rec, dict):
            value.arrays["params"] = dict(rec)
            return value.arrays["params"]
        return None
    if isinstance(value, dict):
        for key in ("global", "params"):
            if isinstance(value.get(key), dict):
                value[key] = dict(value[key])
                return value[key]
        if value and all(isinstance(v, torch.Tensor) for v in value.values()):
            return value
    return None
