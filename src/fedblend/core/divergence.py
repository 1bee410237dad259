"""Divergence is never a result: the engine's checks for NaN / inf and for loss explosions.

Before aggregation every tensor of every training reply *and of the client's new state* (what it keeps and never
uploads, e.g. Ditto's personalized model) is checked (:meth:`DivergenceChecks._nonfinite`): NaN / inf stops the
run (:class:`~fedblend.common.errors.NonFiniteError`, ``on_nonfinite = "stop"``) or is dropped with the client's
new state and stats (``"skip"``: the aggregate is over the other clients; ``nonfinite_clients`` in metrics).

After each round the engine checks for divergence (:meth:`DivergenceChecks.diverging`): NaN / inf in the server
state after aggregation, in a training client's reported losses (``train_loss``, ``personal_loss``, ...) or in an
evaluation loss (a personalized or global model that is NaN), every reply of a phase skipped as non-finite, or a
finite explosion of a loss: a client training loss or an evaluation loss above ``divergence_factor x max(ln C,
L1)`` (``C`` classes, ``L1`` that loss's first recorded value in the run; until there is one,
``divergence_factor x ln C``). The round's metrics then carry ``"diverged": reason``; ``on_divergence = "stop"``
raises :class:`~fedblend.common.errors.DivergedError` after the round, ``"warn"`` warns once and goes on (the run
is still reported as diverged at its end, :mod:`fedblend.experiment`).

Either line names the method (a plug-in by ``pkg.module:Class``) and, where it is known, the hook or phase in which
the first non-finite value appeared: the server half's ``aggregate`` of a phase (the server state was finite
before it), its ``init_server`` or ``configure``, or -- for a client's update, found by replaying that client's job
in this process (:func:`nonfinite_origin`) -- the parameters local training started from, the method's
``loss_terms`` (training turned non-finite with them, not without them), local training itself (the learning
rate), or its ``reply``.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import replace

import torch

from fedblend.common.errors import DivergedError, NonFiniteError
from fedblend.common.guard import plugin_name
from fedblend.core.client import ClientJob, ClientResult, ClientRuntime, drive
from fedblend.core.message import first_nonfinite, first_nonfinite_value
from fedblend.core.method import State, train_now
from fedblend.core.training import TrainResult, TrainSpec

EVAL_LOSSES = ("loss", "global_loss", "val_loss", "val_global_loss")  # held to the divergence bound
LOSS_NAMES = {"loss": "the personalized models' test loss", "global_loss": "the global model's test loss",
              "val_loss": "the personalized models' validation loss",
              "val_global_loss": "the global model's validation loss"}


def loss_alarms(selected: list[int], stats: dict[int, dict], loss_keys: list[str], trains: dict[int, int]) -> list[str]:
    """The first client (of ``selected``, in order) with training data whose reported losses (``loss_keys``)
    hold NaN / inf, as an alarm; ``trains``: each client's number of training samples."""
    for c in selected:
        bad = [k for k in loss_keys if isinstance(stats[c].get(k), float) and not math.isfinite(stats[c][k])]
        if bad and trains[c] > 0:
            return [f"client {c}'s {bad[0]} is {stats[c][bad[0]]}"]
    return []


class DivergenceChecks:
    """The checks of :class:`~fedblend.core.engine.Simulation` (a mixin over its fields ``on_nonfinite``,
    ``on_divergence``, ``divergence_factor``, ``diverged``, ``history``, ``fed`` and the round's ``_alarms`` /
    ``_loss_keys``)."""

    def loss_bound(self, key: str, rnd: int) -> float:
        """The value of loss ``key`` (a metrics column) above which round ``rnd`` (1-based) counts as diverged:
        ``divergence_factor x max(ln C, L1)``, ``L1`` the first finite value of ``key`` recorded before round
        ``rnd`` (none yet: ``ln C``, the cross-entropy of a uniform guess over the ``C`` classes)."""
        ref = math.log(max(2, int(self.fed.info.get("num_classes", 2))))
        first = next((m[key] for m in self.history if m["round"] < rnd
                      and isinstance(m.get(key), float) and math.isfinite(m[key])), None)
        return self.divergence_factor * max(ref, first if first is not None else ref)

    def diverging(self, metrics: dict) -> str | None:
        """Check the round just recorded (``metrics``, with this round's findings) for divergence; on one, mark
        the row ``"diverged"`` and stop (``on_divergence = "stop"``: :class:`DivergedError`) or warn once
        (``"warn"``). Returns the reason, or None.

        The losses held to the bound (:meth:`loss_bound`): the clients' training losses (``train_loss`` and every
        other ``*_loss`` clients report, e.g. Ditto's ``personal_loss``) and the evaluation losses (``loss``,
        ``global_loss`` and their ``val_`` twins); not the server's own (an agent's or autoencoder's)."""
        alarms = list(self._alarms)
        for key in [*self._loss_keys, *EVAL_LOSSES]:
            loss = metrics.get(key)
            if isinstance(loss, float) and math.isfinite(loss) and loss > self.loss_bound(key, metrics["round"]):
                what = LOSS_NAMES.get(key, f"the clients' mean {key}")
                alarms.append(f"{what} {loss:.4g} exceeds the divergence bound "
                              f"{self.loss_bound(key, metrics['round']):.4g} (divergence_factor "
                              f"{self.divergence_factor:g} x max(ln classes, its first value))")
                break
        self._alarms, origin, self._origin = [], self._origin, None
        if not alarms:
            return None
        reason = "; ".join(alarms)
        metrics["diverged"] = reason
        rnd = metrics["round"]
        first = self.diverged is None
        if first:
            self.diverged = {"round": rnd, "reason": reason}
        fix = ("lower train.lr or the method's step sizes / regularisation weights, check the data; "
               "divergence_factor sets the loss bound, on_divergence = 'warn' lets such a run go on")
        named = self._named(origin)
        if first:
            self.diverged_named = named  # the final error line of a run that went on names it too
        if self.on_divergence == "stop":
            raise DivergedError(f"round {rnd}: the run diverged: {reason} {named}. It stopped (on_divergence = "
                                f"'stop'): {fix}", rnd, reason)
        if first:
            warnings.warn(f"round {rnd}: the run diverged: {reason} {named}; it goes on (on_divergence = 'warn') but "
                          f"will be reported as diverged", RuntimeWarning, stacklevel=2)
        return reason

    def _named(self, origin: str | None) -> str:
        """``[method plug-in 'x' (pkg.module:Class), first in <origin>]``: the method, and where known the hook or
        phase in which the first non-finite value appeared."""
        who = plugin_name(self.method, "method", self.method.label)
        return f"[{who}, first in {origin}]" if origin else f"[{who}]"

    def _server_origin(self, before: State, phase: str, t: int) -> str | None:
        """Where a server state that is non-finite after the ``phase`` of round ``t`` turned so: its aggregate
        (the state ``before`` the phase was finite and was replaced), or its ``init_server`` (non-finite from the
        start)."""
        if first_nonfinite_value(before) is None:
            return None if before is self.server else f"its aggregate of the {phase} phase"
        return "its init_server" if t == 0 else None

    def _nonfinite(self, res: ClientResult, job: ClientJob) -> bool:
        """Whether the reply or new state of ``job``'s client holds NaN / inf and is to be skipped; raises under
        ``"stop"``, naming the method and where the first non-finite value appeared (:func:`nonfinite_origin`)."""
        cid, phase, t = job.cid, job.phase, job.rnd
        reply = res.reply
        where = first_nonfinite(reply.arrays)
        what = "update"
        if where is None:
            where, what = first_nonfinite_value(res.state), "state (kept on the client)"
        if where is None:
            return False
        if self.on_nonfinite == "stop":
            origin = nonfinite_origin(self.client_runtime(), job, self.server)
            raise NonFiniteError(
                f"round {t + 1}: client {cid}'s {phase} {what} has NaN or inf values (in {where}) "
                f"{self._named(origin)}; the run stopped before aggregating it (on_nonfinite = 'stop'). Lower "
                f"train.lr, check the client's data, or set on_nonfinite = 'skip' to drop such updates",
                t + 1, cid, where)
        return True


def nonfinite_origin(runtime: ClientRuntime, job: ClientJob, server: State) -> str | None:
    """Where the NaN / inf of ``job``'s result first appeared, found by replaying the job in ``runtime`` (this
    process, the client's own data and random streams: the same computation; only when the run stops on it, so
    no result depends on it): in the server's message (its ``configure``; its state already, ``init_server``),
    the client's first state (``init_client``), the parameters local training started from (``client_init``,
    ``before_training``, a transform), the method's loss terms (training from finite parameters turns
    non-finite with them and stays finite without them), local training itself, or the ``reply`` (or kept state)
    made from a finite trained model. None when the replay cannot tell (it raises, or stays finite)."""
    try:
        with torch.enable_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _replay(runtime, job, server)
    except Exception:  # noqa: BLE001 - the replay only adds detail to the stop it explains
        return None


def _replay(runtime: ClientRuntime, job: ClientJob, server: State) -> str | None:
    where = first_nonfinite(job.msg.arrays)
    if where is not None:
        made = ("the server state it sends (init_server, or an earlier round's aggregate)"
                if first_nonfinite_value(server) is not None else f"its configure of the {job.phase} phase")
        return f"{made}: the message to the client holds them (in {where})"
    ctx, state = runtime.begin(job)
    if job.state is None and first_nonfinite_value(state) is not None:
        return f"its init_client (in {first_nonfinite_value(state)})"
    found: list[str] = []
    trained: list[bool] = []

    def execute(spec: TrainSpec) -> TrainResult:
        trained.append(True)
        start = first_nonfinite_value(spec.params)
        if not found and start is not None:
            found.append(f"the parameters local training starts from (client_init, before_training or a "
                         f"transform; in {start})")
        res = train_now(spec, ctx)
        if not found and not _finite(res):
            names = ", ".join(t.name for t in spec.loss_terms)
            if spec.loss_terms and _finite(train_now(replace(spec, loss_terms=()), ctx)):
                found.append(f"its loss_terms ({names}): local training from finite parameters turned non-finite "
                             f"with them and stays finite without them")
            else:
                terms = f"with loss terms {names}" if names else "no loss terms"
                found.append(f"local training from finite parameters ({terms}: train.lr or the method's step "
                             f"sizes)")
        return res

    reply, new_state = drive(runtime.method.client_step(job.phase, job.msg, state, ctx), execute)
    if found or not trained:  # (a client half that trains no spec: where inside it, the replay cannot tell)
        return found[0] if found else None
    if first_nonfinite(reply.arrays) is not None:
        return "its reply (the model local training returned is finite)"
    if first_nonfinite_value(new_state) is not None:
        return "the state it keeps (the model local training returned is finite)"
    return None


def _finite(res: TrainResult) -> bool:
    """Whether a piece of local training stayed finite: its parameters, and its mean loss where it trained."""
    return first_nonfinite_value(res.params) is None and (not res.steps or math.isfinite(res.mean_loss))
