"""A plug-in method whose chosen hook returns a plausible wrong kind of object, as a researcher's one-file plug-in
would get it wrong (``method = "tests.wrong_returns:WrongReturn"``; module level, so worker processes import it).

``options.hook`` names the hook (any of the 20: the halves' ``HOOKS`` and ``Method.HOOKS``), ``options.round``
(0-based) and ``options.client`` (-1: every client) when. :data:`WRONG` holds, per hook, what it returns instead
of its contract's type and the type it must return (``tests/test_wrong_returns.py`` checks that the one error line
names the hook with both; ``tests/plugin_faults.py`` plants the same values as its ``wrongtype`` fault).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from fedblend.algorithms.fedavg import FedAvg
from fedblend.core.evaluation import EvalSpec
from fedblend.core.message import Message
from fedblend.core.method import train_now, train_spec
from fedblend.core.transform import ClientTransform

#: hook -> (what it returns instead, given the right value and the hook's arguments; the type named as returned)
WRONG = {
    "init_server": (lambda v, *a: Message(v), "Message"),  # the state as a Message, like configure's
    "phases": (lambda v, *a: "train", "str"),  # one phase's name, not a sequence of names
    "configure": (lambda v, *a: v.params(), "dict"),  # the parameters, not wrapped in a Message
    "aggregate": (lambda v, *a: (v, {}), "tuple"),  # (state, metrics), as Flower's aggregate_fit returns
    "configure_train": (lambda v, *a: v.params(), "dict"),
    "aggregate_train": (lambda v, *a: (v, {}), "tuple"),
    "configure_evaluate": (lambda v, *a: v.arrays, "dict"),
    "init_client": (lambda v, *a: Message(v), "Message"),  # a Message, not the client state
    "client_step": (lambda v, *a: (Message(), {}), "tuple"),  # (reply, state) returned, not yielded from
    "before_training": (lambda v, msg, *a: (msg, v), "tuple"),  # (message, state), like a transform's apply
    "client_init": (lambda v, msg, *a: msg, "Message"),  # the message, not its parameters
    "loss_terms": (lambda v, *a: {"prox": v}, "dict"),  # named terms
    "local_training": (lambda v, *a: v, "tuple"),  # (result, state) from a plain function, not a generator
    "scored_params": (lambda v, params, msg, cstate, ctx: ctx.model, "MLP"),  # the model, not its parameters
    "reply": (lambda v, *a: v.params(), "dict"),  # the parameters, not wrapped in a Message
    "personalized_params": (lambda v, msg, cstate, ctx: ctx.model, "MLP"),
    "eval_params": (lambda v, *a: EvalSpec(v), "EvalSpec"),  # what evaluate returns, not the parameters
    "evaluate": (lambda v, *a: v.params, "dict"),  # the parameters, not wrapped in an EvalSpec
    "declare": (lambda v, *a: asdict(v), "dict"),  # the traits as a dict
    "eval_models": (lambda v, *a: list(v), "list"),  # the choices' names only
}


@dataclass
class WrongOptions:
    hook: str = ""
    round: int = 0
    client: int = -1


class WrongReturn(FedAvg):
    """FedAvg whose ``options.hook`` returns :data:`WRONG`'s value for it (module docstring)."""

    name = "wrong-return"
    options_cls = WrongOptions
    fired = False

    def _wrong(self, hook: str, value, rnd: int | None, cid: int | None, *args):
        o = self.opts
        if o.hook != hook or (rnd is not None and o.round != rnd) or (cid is not None and o.client not in (-1, cid)):
            return value
        type(self).fired = True
        return WRONG[hook][0](value, *args)

    def declare(self, choice):
        return self._wrong("declare", super().declare(choice), None, None)

    def eval_models(self):
        return self._wrong("eval_models", super().eval_models(), None, None)

    def init_server(self, sctx):
        return self._wrong("init_server", super().init_server(sctx), sctx.rnd, None)

    def phases(self, sctx):
        return self._wrong("phases", super().phases(sctx), sctx.rnd, None)

    def configure(self, phase, server, cid, sctx):
        return self._wrong("configure", super().configure(phase, server, cid, sctx), sctx.rnd, cid)

    def aggregate(self, phase, server, replies, sctx):
        return self._wrong("aggregate", super().aggregate(phase, server, replies, sctx), sctx.rnd, None)

    def configure_train(self, server, cid, sctx):
        return self._wrong("configure_train", super().configure_train(server, cid, sctx), sctx.rnd, cid)

    def aggregate_train(self, server, replies, sctx):
        return self._wrong("aggregate_train", super().aggregate_train(server, replies, sctx), sctx.rnd, None)

    def configure_evaluate(self, server, cid, sctx):
        return self._wrong("configure_evaluate", super().configure_evaluate(server, cid, sctx), sctx.rnd, cid)

    def init_client(self, ctx):
        return self._wrong("init_client", super().init_client(ctx), ctx.rnd, ctx.cid)

    def client_step(self, phase, msg, cstate, ctx):
        work = super().client_step(phase, msg, cstate, ctx)
        return self._wrong("client_step", work, ctx.rnd, ctx.cid)

    def before_training(self, msg, cstate, ctx):
        return self._wrong("before_training", super().before_training(msg, cstate, ctx), ctx.rnd, ctx.cid, msg)

    def client_init(self, msg, cstate, ctx):
        return self._wrong("client_init", super().client_init(msg, cstate, ctx), ctx.rnd, ctx.cid, msg)

    def loss_terms(self, msg, params, cstate, ctx):
        return self._wrong("loss_terms", super().loss_terms(msg, params, cstate, ctx), ctx.rnd, ctx.cid)

    def local_training(self, params, msg, cstate, ctx):
        o = self.opts
        if o.hook == "local_training" and o.round == ctx.rnd and o.client in (-1, ctx.cid):
            type(self).fired = True  # trains at once and returns (result, state): a function, not a generator
            return WRONG["local_training"][0]((train_now(train_spec(self, params, msg, cstate, ctx), ctx), cstate))
        return super().local_training(params, msg, cstate, ctx)

    def scored_params(self, params, msg, cstate, ctx):
        value = super().scored_params(params, msg, cstate, ctx)
        return self._wrong("scored_params", value, ctx.rnd, ctx.cid, params, msg, cstate, ctx)

    def reply(self, res, msg, cstate, ctx):
        return self._wrong("reply", super().reply(res, msg, cstate, ctx), ctx.rnd, ctx.cid)

    def personalized_params(self, msg, cstate, ctx):
        value = super().personalized_params(msg, cstate, ctx)
        return self._wrong("personalized_params", value, ctx.rnd, ctx.cid, msg, cstate, ctx)

    def eval_params(self, msg, cstate, ctx):
        return self._wrong("eval_params", super().eval_params(msg, cstate, ctx), ctx.rnd, ctx.cid)

    def evaluate(self, msg, cstate, ctx):
        return self._wrong("evaluate", super().evaluate(msg, cstate, ctx), ctx.rnd, ctx.cid)


#: a client transform's hook -> (what it returns instead, given the right value; the type named as returned)
WRONG_TRANSFORM = {
    "declare": (lambda v: asdict(v), "dict"),  # the traits as a dict
    "apply": (lambda v: v[0], "dict"),  # the parameters only, not (parameters, client state)
    "after_train": (lambda v: (v, {}), "tuple"),  # (state, metrics)
    "eval_params": (lambda v: EvalSpec(v), "EvalSpec"),
    "eval_models": (lambda v: list(v), "list"),  # the choices' names only
    "eval_description": (lambda v: {"trained": v}, "dict"),
}


@dataclass
class WrongTransformOptions:
    hook: str = ""


class WrongTransform(ClientTransform):
    """A client transform (changing nothing) whose ``options.hook`` returns :data:`WRONG_TRANSFORM`'s value."""

    name = "wrong-transform"
    options_cls = WrongTransformOptions

    def _out(self, hook: str, value):
        return WRONG_TRANSFORM[hook][0](value) if self.opts.hook == hook else value

    def declare(self):
        return self._out("declare", super().declare())

    def apply(self, method, params, cstate, ctx):
        return self._out("apply", (params, cstate))

    def after_train(self, method, params, cstate, ctx):
        return self._out("after_train", cstate)

    def eval_params(self, method, msg, cstate, ctx, params):
        return self._out("eval_params", params)

    def eval_models(self, method, current):
        return self._out("eval_models", current)

    def eval_description(self, method, current):
        return self._out("eval_description", current)
