"""Compare metric histories (lists of round rows) across runs, exactly or up to floating-point noise.

Two runs of the same code on the same machine (same thread count) are bit-identical: every backend, a resumed
run and a refactor that must not move results are compared with ``exact=True``. Two *machines* are not: their
BLAS / oneDNN kernels sum in other orders and vector widths, so a float can differ in its last bits (seen: loss
1.3471820 vs 1.3471821, train_loss 1.32303511 vs 1.32303510 between two x86-64 CPUs after one round). Across
machines, floats are compared with a tight relative tolerance (``REL``, ``ABS``); everything discrete (round
numbers, sampled clients, byte counts, skip counters, strings) must still match exactly.

The tolerance is ~100x the drift measured between two CPUs and ~100x below what a one-percent change of the
learning rate moves (``tests/test_golden.py`` checks both: a last-bit perturbation of the data passes, a real
change fails).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

#: relative / absolute tolerance for floats compared across machines
REL = 1e-5
ABS = 1e-7


def _close(a: float, b: float, rel: float, abs_: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if rel == 0 and abs_ == 0:
        return a == b
    return math.isclose(a, b, rel_tol=rel, abs_tol=abs_)


def _is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def diff_values(want, got, path: str = "", *, rel: float = REL, abs_: float = ABS) -> list[str]:
    """Where ``got`` differs from ``want`` (nested dicts / lists of numbers and strings), one line per place.

    Floats (a float on either side) are compared within ``rel`` / ``abs_`` (exactly when both are 0); ints,
    bools, strings and ``None`` exactly, and so are dict keys and list lengths."""
    if isinstance(want, dict) or isinstance(got, dict):
        if not (isinstance(want, dict) and isinstance(got, dict)):
            return [f"{path or '<root>'}: {want!r} != {got!r}"]
        out = []
        for k in sorted(set(want) | set(got), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in want or k not in got:
                out.append(f"{p}: {'<missing>' if k not in want else want[k]!r} != "
                           f"{'<missing>' if k not in got else got[k]!r}")
            else:
                out += diff_values(want[k], got[k], p, rel=rel, abs_=abs_)
        return out
    if isinstance(want, (list, tuple)) or isinstance(got, (list, tuple)):
        if not (isinstance(want, (list, tuple)) and isinstance(got, (list, tuple))) or len(want) != len(got):
            return [f"{path or '<root>'}: {want!r} != {got!r}"]
        out = []
        for i, (w, g) in enumerate(zip(want, got)):
            out += diff_values(w, g, f"{path}[{i}]", rel=rel, abs_=abs_)
        return out
    if (isinstance(want, float) or isinstance(got, float)) and _is_num(want) and _is_num(got):
        return [] if _close(float(want), float(got), rel, abs_) else [f"{path}: {want!r} != {got!r}"]
    if type(want) is not type(got) or want != got:
        return [f"{path or '<root>'}: {want!r} != {got!r}"]
    return []


def diff_histories(want: Iterable[dict], got: Iterable[dict], *, exact: bool = False,
                   rel: float = REL, abs_: float = ABS) -> list[str]:
    """Differences between two metric histories, prefixed by round; ``exact=True`` demands bit-equality (same
    machine), otherwise floats may differ by the cross-machine tolerance."""
    want, got = list(want), list(got)
    if len(want) != len(got):
        return [f"{len(got)} rounds, expected {len(want)}"]
    if exact:
        rel = abs_ = 0.0
    out = []
    for w, g in zip(want, got):
        rnd = w.get("round", "?") if isinstance(w, dict) else "?"
        out += [f"round {rnd} {d}" for d in diff_values(w, g, rel=rel, abs_=abs_)]
    return out


def without_per_client(history: Iterable[dict]) -> list[dict]:
    """Rows without their per-client fields (keys ending in ``per_client``: ``per_client``,
    ``global_per_client``, ``val_per_client``, ...). They were added after the goldens were recorded and hold the
    same counts the pooled fields are summed from, so golden comparisons leave them out rather than re-recording
    (every other field must still match)."""
    return [{k: v for k, v in m.items() if not str(k).endswith("per_client")} if isinstance(m, dict) else m
            for m in history]
