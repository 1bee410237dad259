"""A round's metrics row, from what its exchanges left (:class:`RoundTally`): accuracy-free training numbers --
bytes down / up per client, seconds, the clients' stats as their mean over the selected clients, their losses
(``train_loss``, every ``*_loss``) and the stats the method names in ``per_client_stats`` also per client
(``stats_per_client``), pooled before / after counts, time shares, the clients skipped or dropped. The engine adds
evaluation and the backend's report after these (:mod:`fedblend.core.engine`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RoundTally:
    """What one round's exchanges record per selected client: bytes down / up, the stats of accepted replies,
    the clients skipped as non-finite or dropped (no reply), and per phase the replies received and skipped."""

    selected: list[int]
    stats: dict[int, dict] = field(default_factory=dict)
    down: dict[int, int] = field(default_factory=dict)
    up: dict[int, int] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)  # no reply (a backend that tolerates faults returns None)
    answered: dict[str, int] = field(default_factory=dict)  # replies received per phase
    refused: dict[str, int] = field(default_factory=dict)  # of them skipped as non-finite
    first_skipped: Any = None  # the ClientJob of the first reply skipped as non-finite (to tell where it came from)

    def __post_init__(self) -> None:
        self.stats = {cid: {} for cid in self.selected}
        self.down = dict.fromkeys(self.selected, 0)
        self.up = dict.fromkeys(self.selected, 0)

    def loss_keys(self) -> list[str]:
        """The clients' training losses this round: ``train_loss`` and every ``*_loss`` a client reported."""
        return sorted({k for c in self.selected for k in self.stats[c] if k.endswith("_loss")} | {"train_loss"})


def round_metrics(t: int, tally: RoundTally, server_stats: dict, loss_keys: list[str],
                  per_client_stats: tuple[str, ...], seconds: float) -> dict[str, Any]:
    """Round ``t``'s (0-based) metrics row before evaluation (module docstring)."""
    selected, stats = tally.selected, tally.stats
    metrics: dict[str, Any] = {
        "round": t + 1,
        "selected": selected,
        "bytes_down": [tally.down[c] for c in selected],
        "bytes_up": [tally.up[c] for c in selected],
        "train_loss": _mean([stats[c].get("train_loss") for c in selected]),
        "seconds": seconds,
    }
    pooled, consumed = _pool_counts([stats[c] for c in selected])
    metrics.update(pooled)
    for key in sorted({k for c in selected for k in stats[c]} - {"train_loss"} - consumed):
        metrics[key] = _mean([stats[c].get(key) for c in selected])
    metrics.update(server_stats)
    metrics.update(_time_shares([stats[c] for c in selected]))
    per_client = _stats_per_client(selected, stats, tuple(loss_keys) + per_client_stats)
    if per_client:
        metrics["stats_per_client"] = per_client
    if tally.skipped:
        metrics["nonfinite_clients"] = sorted(set(tally.skipped))
    if tally.dropped:
        metrics["dropped_clients"] = sorted(set(tally.dropped))
    return metrics


def _time_shares(stats: list[dict]) -> dict[str, float]:
    """For every per-client timing ``X_seconds`` a method or transform reports (e.g. ALA's ``ala_seconds``),
    ``X_share``: its sum over the round's clients divided by their summed ``client_seconds`` (the whole client
    update), i.e. the part of the round's client work spent in X."""
    total = sum(s.get("client_seconds", 0.0) for s in stats)
    keys = sorted({k for s in stats for k in s if k.endswith("_seconds") and k != "client_seconds"})
    if total <= 0:
        return {}
    return {k[: -len("_seconds")] + "_share": sum(float(s.get(k) or 0.0) for s in stats) / total for k in keys}


def _pool_counts(stats: list[dict]) -> tuple[dict[str, float], set[str]]:
    """Per-client counts ``X_correct`` / ``X_n`` pooled into ``X_acc = sum correct / sum n`` over the round's
    clients (e.g. the before / after local training scores); returns the values and the keys consumed."""
    tags = sorted({k[: -len("_correct")] for s in stats for k in s if k.endswith("_correct")})
    values, keys = {}, set()
    for t in tags:
        n = sum(int(s.get(f"{t}_n", 0)) for s in stats)
        values[f"{t}_acc"] = sum(int(s.get(f"{t}_correct", 0)) for s in stats) / n if n else float("nan")
        keys |= {f"{t}_correct", f"{t}_n"}
    return values, keys


def _stats_per_client(selected: list[int], stats: dict[int, dict], prefixes: tuple[str, ...]) -> dict:
    """The client stats whose key starts with one of ``prefixes``, per client: ``{"clients": [id, ...], key:
    [value, ...]}`` over the selected clients that reported any of them (None where a client did not report a
    key); ``{}`` when none did."""
    if not prefixes:
        return {}
    keys = sorted({k for c in selected for k in stats[c] if k.startswith(prefixes)})
    cids = [c for c in selected if any(k in stats[c] for k in keys)]
    if not cids:
        return {}
    return {"clients": [int(c) for c in cids],
            **{k: [None if stats[c].get(k) is None else float(stats[c][k]) for c in cids] for k in keys}}


def _mean(values: list) -> float:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else float("nan")
