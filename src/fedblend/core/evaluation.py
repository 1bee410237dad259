"""Evaluation: per-client accuracy and loss of a model on a client's data.

The protocol (which model, when, how aggregated) is explicit and written into every result; see
:class:`EvalProtocol`. What a client evaluates is an :class:`EvalSpec`: parameters and, where the method
classifies otherwise than the model's own forward pass (FedProto's nearest prototype, DBE's representation bias),
the :class:`~fedblend.core.training.Forward` that turns them and a batch into logits. ``pooled`` accuracy is
sum of correct / sum of samples over clients (PFLlib, FedAPA); ``client_mean`` / ``client_std`` are over clients
with at least one test sample.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from fedblend.common.errors import ConfigError
from fedblend.common.params import Params
from fedblend.core.training import Forward


@dataclass(frozen=True)
class EvalProtocol:
    """What a reported accuracy means (the ``[eval]`` table of a run config)."""

    CHOICES: ClassVar[dict] = {"split": ("test", "val"), "report": ("best", "final"), "select": ("test", "val")}
    RANGES: ClassVar[dict] = {"every": "[1, 1000000]", "batch_size": "[1, 1000000]", "clients": "[1, 100000]", "target": "(0, 1]"}

    #: evaluate every k rounds (and the last)
    every: int = 1
    #: ``val`` needs ``partition.split = "train_val_test"``
    split: str = "test"
    #: evaluation batch
    batch_size: int = 2048
    #: headline ``accuracy`` in summary.json: ``best`` or ``final`` round (both always recorded)
    report: str = "best"
    #: ``val``: evaluate validation and test every evaluated round; the headline ``accuracy`` is the test accuracy at the
    #: best-validation round (``selected_round``, ``test_accuracy_at_best_val``), best and final test recorded beside it.
    #: Needs ``partition.split = "train_val_test"``, ``split = "test"``, ``report = "best"``
    select: str = "test"
    #: evaluate only this many clients per evaluated round, a subset drawn from the seed tree (the same for every method
    #: and backend with this seed, a different one each round; ``eval_clients`` in metrics). The reported accuracy is
    #: then pooled over that subset: an estimate of the all-client number, noisier with fewer clients. Use it (or
    #: ``every``, which evaluates every k-th round and the last) when evaluation dominates a large run
    clients: int | None = None
    #: also score every training client's model before (``bp_acc``: the model it trains from, i.e. what it received after
    #: any transform) and after (``ap_acc``) its local training, on ``split``, pooled over the round's participants;
    #: summary.json gains ``bp_/ap_best_accuracy``, ``bp_/ap_final_accuracy`` (pFedRLLA Table 2). Works for every method
    #: that uses the client template (``Method.client_train``)
    before_after: bool = False
    #: summary.json's ``rounds_to_target``: the first round whose accuracy reaches ``target`` (``null`` if never)
    target: float | None = None
    #: which model of each client the personalized accuracy (``acc``) evaluates: one of the method's choices below; unset
    #: = its default, the method's paper (``"received"``: what the client would start training from now; ``"trained"``:
    #: its model after its last local training; the others are the method's own, described on its page in
    #: ``docs/methods/``). The summary's ``protocol.personalized_model`` says it in words. A config that sets one of the
    #: earlier per-method options (``[options] eval`` of dbe, fedgh, fedphp, fedproto, pfedhn, pfedla, fedala;
    #: ``eval_global`` of apfl; ``[ala] eval``) loads with a warning, read as this field
    model: str | None = None

    def validate(self, where: str) -> None:
        """The cross-field rules of ``[eval]`` (a ``ConfigError`` naming ``where``)."""
        if self.select == "val" and self.split != "test":
            raise ConfigError(f"{where}.select = 'val' picks the round on validation and reports test accuracy; "
                              f"it needs {where}.split = 'test', got {self.split!r}")
        if self.select == "val" and self.report != "best":
            raise ConfigError(f"{where}.select = 'val' reports the best-validation round; {where}.report must be "
                              f"'best', got {self.report!r}")


@dataclass(frozen=True)
class EvalSpec:
    """The model a client evaluates: ``params``, and the forward pass that gives its logits on a batch
    (``forward(model, params, x, False)[0]``, a :class:`~fedblend.core.training.Forward` as local training
    uses; None: the model's own, ``functional_call(model, params, (x,))``). ``params`` may hold entries that are
    not model parameters, which ``forward`` consumes (DBE's bias)."""

    params: Params
    forward: Forward | None = None

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """The logits of this model on the batch ``x``."""
        if self.forward is None:
            return functional_call(model, dict(self.params), (x,))
        return self.forward(model, self.params, x, False)[0]


def as_eval_spec(model: Params | EvalSpec) -> EvalSpec:
    """An :class:`EvalSpec` of a hook's answer: a spec as it is, a parameter dictionary with the model's forward."""
    return model if isinstance(model, EvalSpec) else EvalSpec(model)


GLOBAL_PREFIX = "global_"  # the global model's counts in an evaluation reply's metrics


class EvalCounts(NamedTuple):
    """One model on one client's evaluation split: correct predictions, summed loss, samples. An evaluation reply
    carries the personalized model's as metrics ``correct`` / ``loss`` / ``n`` and, when the message carried a
    global model, the global model's as ``global_correct`` / ``global_loss`` / ``global_n``
    (:meth:`to_metrics` / :meth:`from_metrics` are the only code that spells these keys)."""

    correct: int
    loss: float
    n: int

    def to_metrics(self, prefix: str = "") -> dict[str, int | float]:
        """The counts as an evaluation reply's metrics: ``{prefix}correct``, ``{prefix}loss``, ``{prefix}n``."""
        return {f"{prefix}correct": int(self.correct), f"{prefix}loss": float(self.loss), f"{prefix}n": int(self.n)}

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any], prefix: str = "") -> EvalCounts | None:
        """The counts under ``prefix`` in an evaluation reply's metrics (None when it has none)."""
        if f"{prefix}correct" not in metrics:
            return None
        return cls(int(metrics[f"{prefix}correct"]), float(metrics[f"{prefix}loss"]), int(metrics[f"{prefix}n"]))

    @property
    def nonfinite_loss(self) -> bool:
        """Whether the summed loss over a non-empty split is NaN / inf."""
        return bool(self.n) and not math.isfinite(self.loss)


@torch.no_grad()
def evaluate_params(model: nn.Module, params: Mapping[str, torch.Tensor] | EvalSpec, x: torch.Tensor,
                    y: torch.Tensor, batch_size: int = 2048) -> EvalCounts:
    """``(correct, summed loss, n)`` of the model with ``params`` (or an :class:`EvalSpec`) on ``(x, y)``."""
    spec = as_eval_spec(params)
    correct, loss = 0, 0.0
    for i in range(0, len(y), batch_size):
        out = spec.logits(model, x[i : i + batch_size])
        loss += float(F.cross_entropy(out, y[i : i + batch_size], reduction="sum"))
        correct += int((out.argmax(1) == y[i : i + batch_size]).sum())
    return EvalCounts(correct, loss, int(len(y)))


def summarise(per_client: Sequence[tuple[int, float, int]]) -> dict:
    """Pooled accuracy and loss, plus mean / std over clients of the per-client accuracy."""
    correct = sum(c for c, _, _ in per_client)
    n = sum(k for _, _, k in per_client)
    accs = np.array([c / k for c, _, k in per_client if k > 0])
    return {
        "acc": correct / n if n else float("nan"),
        "loss": sum(lo for _, lo, _ in per_client) / n if n else float("nan"),
        "acc_client_mean": float(accs.mean()) if len(accs) else float("nan"),
        "acc_client_std": float(accs.std()) if len(accs) else float("nan"),
    }


#: the fields of a metrics row holding per-client results (``per_client``, ``global_per_client`` and their
#: ``val_`` twins): added after the goldens were recorded, so golden comparisons leave them out
#: (:func:`fedblend.common.histories.without_per_client`)
PER_CLIENT_SUFFIX = "per_client"


def per_client_counts(cids: Sequence[int], per_client: Sequence[tuple[int, float, int]]) -> dict:
    """Each evaluated client's result, compactly and exactly: ``{"clients": [id, ...], "correct": [...], "n":
    [...]}`` (integers; client ``k``'s accuracy is ``correct[k] / n[k]``, undefined where ``n[k] == 0``)."""
    return {"clients": [int(c) for c in cids], "correct": [int(c) for c, _, _ in per_client],
            "n": [int(k) for _, _, k in per_client]}


def client_accuracies(row: dict, key: str = "per_client") -> dict[int, float]:
    """``{client: accuracy}`` of a metrics row's per-client field (clients with no test sample left out)."""
    pc = row.get(key) or {}
    return {c: k / n for c, k, n in zip(pc.get("clients", ()), pc.get("correct", ()), pc.get("n", ())) if n > 0}


def spread(accs: Sequence[float]) -> dict[str, float]:
    """Fairness numbers over clients' accuracies: worst, 10th percentile (numpy's linear interpolation), std
    (population, as ``acc_client_std``) and best."""
    a = np.asarray(list(accs), dtype=float)
    if not len(a):
        return {"worst": float("nan"), "p10": float("nan"), "std": float("nan"), "best": float("nan")}
    return {"worst": float(a.min()), "p10": float(np.percentile(a, 10)), "std": float(a.std()),
            "best": float(a.max())}


def client_spread_summary(evals: Sequence[dict], headline_round: int | None) -> dict[str, float | int]:
    """summary.json's fairness numbers from the evaluated rows' ``per_client`` counts: worst client, 10th
    percentile and std of the clients' accuracies at the final evaluated round (``final_acc_client_*``) and at
    the headline's round (``headline_acc_client_*``, with ``headline_round``). Empty for rows without them."""
    if not evals or "per_client" not in evals[-1]:
        return {}
    final = spread(client_accuracies(evals[-1]).values())
    out: dict[str, float | int] = {"final_acc_client_worst": final["worst"], "final_acc_client_p10": final["p10"]}
    row = next((m for m in evals if m.get("round") == headline_round), None)
    if row is not None and "per_client" in row:
        head = spread(client_accuracies(row).values())
        out.update(headline_round=headline_round, headline_acc_client_worst=head["worst"],
                   headline_acc_client_p10=head["p10"], headline_acc_client_std=head["std"])
    return out
