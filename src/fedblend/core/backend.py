"""The backend interface: how the engine's client jobs reach the client halves (implementations in
:mod:`fedblend.core.backends`, :mod:`fedblend.core.vmap` and :mod:`fedblend.flower.backend`).

Its own module so that every implementation can import it without importing the others.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

from fedblend.common.rng import SeedTree
from fedblend.core.client import ClientJob, ClientResult
from fedblend.core.method import Method, RunInfo
from fedblend.data.federated import ClientData


class Backend(ABC):
    """How the engine's client jobs reach the client halves: the whole interface the engine uses.

    ``start`` once per run (the method, the public run facts, every client's data, the run's seed tree; a
    distributed backend keeps only what it needs, e.g. fingerprints); ``run`` a list of jobs, returning their
    results in the same order (``None`` for a client that did not answer, from a backend that tolerates faults;
    the engine leaves it out of the round); ``report`` what it noticed since the last call, merged into the
    round's metrics (counts, faults, timings; never results); ``close`` at the end (the backend may be started
    again). ``on_result``, when the engine sets it, is called with each job once its result is in (a progress
    display; it never changes results): call :meth:`finished`.
    """

    name: ClassVar[str] = "backend"
    on_result: Callable[[ClientJob], None] | None = None

    @abstractmethod
    def start(self, method: Method, run: RunInfo, data: Mapping[int, ClientData], tree: SeedTree) -> None: ...

    @abstractmethod
    def run(self, jobs: Sequence[ClientJob]) -> list[ClientResult | None]: ...

    def report(self) -> dict:
        return {}

    def close(self) -> None:  # noqa: B027 - optional: most backends hold nothing to release
        """Release what ``start`` acquired (worker processes); nothing by default."""

    def finished(self, job: ClientJob) -> None:
        """Tell the engine's progress hook (if any) that ``job``'s result is in."""
        if self.on_result is not None:
            self.on_result(job)
