"""Method diagnostics: what a method or transform shows of a run beside the accuracy table.

A method (or client transform, or plug-in) declares its diagnostics on its class with
:func:`register_diagnostics`, functions that read the run and return data::

    def weight_matrices(run: RunFiles) -> list[Item]:
        server = run.checkpoint()["server"]
        return [ClientWeights("fedapa_weights_latest", "FedAPA aggregation weights",
                              run.method.effective_weights(server))]

    @register_method
    @register_diagnostics(weight_matrices)
    class FedAPA(Method): ...

``fedblend report RUNS --diagnostics`` (:mod:`fedblend.results.diagnostics`) builds each run's method from its
config and calls every diagnostic registered for the method's classes (its base classes' too) and its
transforms'. A diagnostic returns *data* (the items below), never a figure: drawing is the results library's, so a
method module needs no matplotlib and every method's pictures look alike.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedblend.core.checkpoint import FILENAME, load_checkpoint


@dataclass(frozen=True)
class ClientWeights:
    """An N x N client-to-client weight matrix: row i holds the weights client i's model is built from (FedAPA's
    ``a_ij``). Drawn as a heatmap; with the run's partition, the share of each row's weight on other clients that
    go to clients sharing a class is reported too."""

    name: str
    title: str
    matrix: torch.Tensor


@dataclass(frozen=True)
class Histogram:
    """The distribution of ``values`` (ALA's learned weights at the checkpoint)."""

    name: str
    title: str
    values: torch.Tensor
    xlabel: str
    range: tuple[float, float] | None = None
    log: bool = False


@dataclass(frozen=True)
class Curves:
    """Lines over rounds: ``lines`` maps a label to ``[(round, value), ...]``; ``band`` is ``(label, [(round,
    low, high), ...])`` drawn under them; ``thin`` lines (one per client) are drawn grey and unlabelled."""

    name: str
    title: str
    ylabel: str
    lines: dict[str, list[tuple[int, float]]]
    band: tuple[str, list[tuple[int, float, float]]] | None = None
    thin: list[list[tuple[int, float]]] = field(default_factory=list)
    ylim: tuple[float | None, float | None] | None = None
    empty: str = "nothing recorded"  # what a panel without lines says


@dataclass(frozen=True)
class Numbers:
    """Named numbers, printed and written as JSON."""

    name: str
    values: dict[str, Any]


Item = ClientWeights | Histogram | Curves | Numbers


@dataclass
class RunFiles:
    """What a diagnostic reads: the run directory, its method (built from its config), its metrics rows, and
    its checkpoint on demand (:meth:`checkpoint`; a :class:`~fedblend.common.errors.CheckpointError` names a
    damaged one)."""

    dir: Path
    method: Any
    metrics: list[dict] = field(default_factory=list)
    _checkpoint: dict | None = field(default=None, repr=False)

    def checkpoint(self) -> dict:
        if self._checkpoint is None:
            self._checkpoint = load_checkpoint(self.dir / FILENAME)
        return self._checkpoint

    def has_checkpoint(self) -> bool:
        return (self.dir / FILENAME).is_file()


Diagnostic = Callable[[RunFiles], Sequence[Item]]
_REGISTERED: dict[type, list[Diagnostic]] = {}


def register_diagnostics(*fns: Diagnostic) -> Callable[[type], type]:
    """Class decorator: ``fns`` are diagnostics of the decorated method or transform class (and of its
    subclasses, which may add their own)."""

    def register(cls: type) -> type:
        known = _REGISTERED.setdefault(cls, [])
        known += [fn for fn in fns if fn not in known]
        return cls

    return register


def diagnostics_of(method: Any) -> list[Diagnostic]:
    """Every diagnostic registered for ``method``'s classes and its transforms' classes, each once, in order."""
    classes = [*type(method).__mro__]
    for t in getattr(method, "transforms", ()):
        classes += type(t).__mro__
    out: list[Diagnostic] = []
    for c in classes:
        out += [fn for fn in _REGISTERED.get(c, ()) if fn not in out]
    return out
