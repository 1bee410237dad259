"""Statistics over seeds: mean ± sample std (ddof = 1) cells, curves' mean and bands, paired differences.

Std is the sample standard deviation over seeds (ddof = 1), in the tables and in the figures' bands alike. The
Student-t intervals, the standard error and the paired t-test are :mod:`scipy.stats`'
(``stats.t``, ``stats.sem``, ``stats.ttest_rel``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def mean_std_cell(values: list[float], scale: float = 100.0, digits: int = 2) -> str:
    """``"93.12 ± 0.40"``: mean ± sample std (ddof = 1) of ``values`` times ``scale``; the mean alone for one
    value, ``-`` for none (None and NaN left out)."""
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    a = np.asarray(vals) * scale
    return f"{a.mean():.{digits}f} ± {a.std(ddof=1):.{digits}f}" if len(a) > 1 else f"{a.mean():.{digits}f}"


def mean_or_none(values: list) -> float | None:
    """The mean of the values that are not None, or None."""
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def mean_std(vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample std (ddof = 1, as the table; 0 for a single seed) over the first axis."""
    return vals.mean(0), vals.std(0, ddof=1) if len(vals) > 1 else np.zeros(vals.shape[1:])


def ci_halfwidth(vals: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Half-width of the Student-t confidence interval of the mean over the first axis (0 for a single seed)."""
    if len(vals) < 2:
        return np.zeros(vals.shape[1:])
    from scipy import stats

    return stats.t.ppf(0.5 + level / 2, len(vals) - 1) * vals.std(0, ddof=1) / np.sqrt(len(vals))


def paired_stats(xa: np.ndarray, xb: np.ndarray, seeds: list, level: float, unit: str) -> dict[str, Any]:
    """A - B over paired values: per seed, mean, sample std, Student-t interval and paired t-test p (None with fewer
    than two pairs or zero spread)."""
    from scipy import stats

    d = xa - xb
    res: dict[str, Any] = {"unit": unit, "per_seed": dict(zip(map(str, seeds), d.tolist())),
                           "mean": float(d.mean()) if len(d) else None,
                           "std": float(d.std(ddof=1)) if len(d) > 1 else None, "ci": None, "p": None}
    if len(d) > 1 and d.std(ddof=1) > 0:
        lo, hi = stats.t.interval(level, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
        res.update(ci=[float(lo), float(hi)], p=float(stats.ttest_rel(xa, xb).pvalue))
    return res


def few_seeds_note(n: int, level: float = 0.95) -> str | None:
    """The warning for a paired comparison over fewer than 3 seeds, whose t-interval means little."""
    if n >= 3:
        return None
    if n < 2:
        return f"{n} paired seed: no interval or p-value; run at least 3 seeds (5 or more for a claim)"
    from scipy import stats

    t = stats.t.ppf(0.5 + level / 2, n - 1)
    return (f"only {n} paired seeds: the {round(level * 100)}% interval uses t = {t:.1f} with {n - 1} degree(s) "
            f"of freedom, so it is very wide and means little; run at least 3 seeds (5 or more for a claim)")
