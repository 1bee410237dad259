"""The tracker interface and what every tracker shares: the numbers of a metrics row (:func:`scalar_row`), the
one-line failure (:class:`TrackerError`) and the guard that makes a failing tracker one line or a warning
(:class:`Guarded`, ``[log] on_error``)."""

from __future__ import annotations

import math
import warnings
from typing import Any, Protocol

from fedblend.common.errors import FedblendError


def scalar_row(m: dict) -> dict[str, float]:
    """The numbers of one metrics row as ``metrics.csv`` has them: every scalar, plus ``num_selected``,
    ``bytes_down_total`` and ``bytes_up_total`` from the per-client lists (non-finite values left out)."""
    out: dict[str, float] = {}
    for k, v in m.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "round" and math.isfinite(v):
            out[k] = float(v)
    if isinstance(m.get("selected"), list):
        out["num_selected"] = float(len(m["selected"]))
    for k in ("bytes_down", "bytes_up"):
        if isinstance(m.get(k), list):
            out[f"{k}_total"] = float(sum(m[k]))
    return out


class Tracker(Protocol):
    """A destination for a run's metrics rows: called with each row (a dict as in ``metrics.jsonl``) as the run
    writes it, then closed once."""

    def __call__(self, m: dict) -> None: ...

    def close(self) -> None: ...


def loggable(m: dict) -> bool:
    return "round" in m and not m.get("stopped")


class TrackerError(FedblendError):
    """A tracker cannot log (its store unusable, its server unreachable, its run file damaged): the message names
    the tracker, the store and the fix (``[log] on_error = "warn"`` goes on without the tracker)."""


class Guarded:
    """A tracker whose failures are one line naming it, its store and the round: raised as :class:`TrackerError`
    (``on_error = "stop"``), or warned once, after which the tracker is left out (``"warn"``)."""

    def __init__(self, tracker: Tracker, name: str, where: str, on_error: str = "stop"):
        self.tracker, self.name, self.where, self.on_error, self.off = tracker, name, where, on_error, False

    def _failed(self, what: str, exc: Exception) -> None:
        err = exc if isinstance(exc, TrackerError) else TrackerError(
            f"{self.name} tracker ({self.where}) failed {what}: {type(exc).__name__}: "
            f"{' '.join(str(exc).split())[:300]}; set [log] on_error = \"warn\" to go on without it")
        if self.on_error != "warn":
            raise err from None
        self.off = True
        warnings.warn(f"{err}; the run goes on without it ([log] on_error = 'warn')", RuntimeWarning, stacklevel=3)

    def __call__(self, m: dict) -> None:
        if self.off:
            return
        try:
            self.tracker(m)
        except Exception as exc:  # noqa: BLE001
            self._failed(f"logging round {m.get('round')}", exc)

    def close(self) -> None:
        if self.off:
            return
        try:
            self.tracker.close()
        except Exception as exc:  # noqa: BLE001
            self._failed("at the run's end", exc)

    def __getattr__(self, name: str) -> Any:  # the tracker's own attributes (run_id, uri, ...)
        return getattr(self.tracker, name)
