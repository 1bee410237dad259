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
"""

from __future__ import annotations

import math
import warnings

from fedblend.common.errors import DivergedError, NonFiniteError
from fedblend.core.client import ClientResult
from fedblend.core.message import first_nonfinite, first_nonfinite_value

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
        self._alarms = []
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
        if self.on_divergence == "stop":
            raise DivergedError(f"round {rnd}: the run diverged: {reason}. It stopped (on_divergence = 'stop'): "
                                f"{fix}", rnd, reason)
        if first:
            warnings.warn(f"round {rnd}: the run diverged: {reason}; it goes on (on_divergence = 'warn') but will "
                          f"be reported as diverged", RuntimeWarning, stacklevel=2)
        return reason

    def _nonfinite(self, res: ClientResult, cid: int, phase: str, t: int) -> bool:
        """Whether client ``cid``'s reply or new state holds NaN / inf and is to be skipped; raises under
        ``"stop"``."""
        reply = res.reply
        where = first_nonfinite(reply.arrays)
        what = "update"
        if where is None:
            where, what = first_nonfinite_value(res.state), "state (kept on the client)"
        if where is None:
            return False
        if self.on_nonfinite == "stop":
            raise NonFiniteError(
                f"round {t + 1}: client {cid}'s {phase} {what} has NaN or inf values (in {where}); the run stopped "
                f"before aggregating it (on_nonfinite = 'stop'). Lower train.lr, check the client's data, or set "
                f"on_nonfinite = 'skip' to drop such updates", t + 1, cid, where)
        return True
