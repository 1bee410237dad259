"""The verdict rule of the second validation setting (docs/validation-2.md, issue #51), stated before its runs and
applied here, not in prose.

Inputs per method: fedblend's runs (one per seed, ``{round: accuracy in %}``) and the reference's runs (its own
repetitions, same form). The rule:

1. **Curve**: at each round ``r`` of the second half of the budget (:func:`window`: rounds 10-20 of 20, 25-50 of
   50, 50-100 of 100), ``d(r) = m_F(r) - m_R(r)`` (means over each side's runs) and
   ``se(r) = sqrt(s_F(r)^2 / n_F + s_R(r)^2 / n_R)`` (sample standard deviations); the curves agree when
   ``|d(r)| <= 2 se(r) + FLOOR`` at at least the same share of those rounds as 9 of 11 (rounded up).
2. **Ordering**: for each anchor (Local, FedAvg), the method's final accuracy minus the anchor's has the same sign
   on both sides, or lies within :data:`TIE` points of zero on at least one side.
3. **Divergence** (stated in session 31, after fedblend's first second-setting APPLE run diverged and before any
   other diverged): a run *diverged* when fedblend's divergence check stopped it (``summary.json`` status
   ``diverged``) or, for a reference run, when a loss it recorded is not finite (``runs_nonfinite_loss`` in
   ``reference.json``). A side *diverges* when more than half of its runs diverged. Both sides diverge: **agrees
   (both diverge)**; one side: **differs** (naming that side); neither: rules 1 and 2 over the runs that did not
   diverge (a diverged run is counted and named, never averaged).

"Final accuracy": the mean over the budget's last three rounds (:data:`FINAL`, rounds 18-20, at 20 rounds). The
paired table (each method against Local and FedAvg-FT, paired by seed) is :func:`paired`: mean difference and its
95 % t-interval.

    python bookkeeping/validation2.py results/validation-2     # the verdicts and the paired table, markdown
    python bookkeeping/validation2.py collect CAMPAIGN/runs    # finished runs of both settings into results/
    python bookkeeping/validation2.py rounds results/validation-2/fedavg   # one method, round by round (rule 1)
    python bookkeeping/validation2.py left > queue.txt          # fedblend's missing seeds (campaign.py's queue)

``bookkeeping/tables.py`` writes both into docs/validation-2.md (blocks ``validation2-verdicts``,
``validation2-paired``).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from scipy import stats

Curve = Mapping[int, float]  # round -> accuracy (%)

ROUNDS = tuple(range(10, 21))  # the window at the 20 rounds first stated
INSIDE = 9  # of its 11 rounds
FLOOR = 0.5
TIE = 1.0
FINAL = (18, 19, 20)


def _mean_sd(values: Sequence[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def final(curve: Curve, last: int = FINAL[-1]) -> float:
    """The mean accuracy over the last three rounds of a ``last``-round budget (:data:`FINAL` at the 20 rounds of
    the setting as first stated; rounds 48-50 for the 50-round choices of docs/validation-2.md). A run missing one
    of those rounds is an error, not a shorter mean."""
    rounds = (last - 2, last - 1, last)
    missing = [r for r in rounds if r not in curve]
    if missing:
        raise ValueError(f"a run without round(s) {missing}: the final accuracy needs rounds {list(rounds)}")
    return statistics.fmean(curve[r] for r in rounds)


def window(budget: int) -> tuple[tuple[int, ...], int]:
    """Rule 1's rounds for a ``budget``-round setting and how many of them must lie inside the band: the second
    half of the budget, rounds ``budget // 2`` to ``budget``, and the share 9 of 11 rounded up (20 rounds:
    :data:`ROUNDS`, :data:`INSIDE`; 50: rounds 25-50, 22 of 26; 100: rounds 50-100, 42 of 51), as stated in
    docs/validation-2.md before the runs of a longer budget."""
    if budget < 4:
        raise ValueError(f"a budget of {budget} rounds has no curve window")
    rounds = tuple(range(budget // 2, budget + 1))
    return rounds, math.ceil(len(rounds) * INSIDE / len(ROUNDS))


@dataclass(frozen=True)
class CurveAgreement:
    inside: int  # rounds of the window with |d| <= 2 se + FLOOR
    d_last: float  # d at the budget's last round
    agrees: bool
    of: int = len(ROUNDS)  # rounds in the window


def round_gap(ours: Sequence[Curve], theirs: Sequence[Curve], r: int) -> tuple[float, float]:
    """Rule 1 at round ``r``: ``(d(r), 2 se(r) + FLOOR)``; the round is inside the band when ``|d| <=`` the
    second."""
    (mf, sf), (mr, sr) = _mean_sd([c[r] for c in ours]), _mean_sd([c[r] for c in theirs])
    return mf - mr, 2 * math.sqrt(sf ** 2 / len(ours) + sr ** 2 / len(theirs)) + FLOOR


def curve_agreement(ours: Sequence[Curve], theirs: Sequence[Curve], budget: int = FINAL[-1]) -> CurveAgreement:
    """Rule 1 over :func:`window` of the budget (every run must have every one of its rounds)."""
    rounds, needed = window(budget)
    inside, d = 0, 0.0
    for r in rounds:
        d, band = round_gap(ours, theirs, r)
        inside += abs(d) <= band
    return CurveAgreement(inside, d, inside >= needed, len(rounds))


def same_ordering(method_ours: Sequence[Curve], anchor_ours: Sequence[Curve], method_theirs: Sequence[Curve],
                  anchor_theirs: Sequence[Curve], budget: int = FINAL[-1]) -> tuple[float, float, bool]:
    """Rule 2 for one anchor: (our gap, their gap, whether the rule holds); gaps are mean final accuracies."""
    def gap(method: Sequence[Curve], anchor: Sequence[Curve]) -> float:
        return (statistics.fmean(final(c, budget) for c in method) - statistics.fmean(final(c, budget) for c in anchor))

    ours, theirs = gap(method_ours, anchor_ours), gap(method_theirs, anchor_theirs)
    holds = (ours > 0) == (theirs > 0) or min(abs(ours), abs(theirs)) <= TIE
    return ours, theirs, holds


def paired(method: Mapping[int, Curve], anchor: Mapping[int, Curve], level: float = 0.95, budget: int = FINAL[-1]
           ) -> tuple[float, float, float, int]:
    """Method minus anchor, paired by seed (``{seed: curve}``, the seeds both have): mean of the final-accuracy
    differences and its ``level`` t-interval; ``(mean, low, high, n)`` (an interval of nan for one seed)."""
    seeds = sorted(set(method) & set(anchor))
    diffs = [final(method[s], budget) - final(anchor[s], budget) for s in seeds]
    if not diffs:
        raise ValueError("no seed in common: nothing to pair")
    mean = statistics.fmean(diffs)
    if len(diffs) < 2:
        return mean, math.nan, math.nan, 1
    half = stats.t.ppf(0.5 + level / 2, len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half, len(diffs)


# ------------------------------------------------------------------------------------------------ reading runs
def _run_curve(run: Path, key: str) -> Curve | None:
    """A finished run's ``{round: accuracy in %}`` of metric ``key`` (None for a run that did not finish)."""
    if not (run / "summary.json").exists():
        return None
    if json.loads((run / "summary.json").read_text()).get("status") != "finished":
        return None
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    return {m["round"]: 100 * m[key] for m in rows if m.get(key) is not None}


def seed_dirs(folder: Path, prefix: str, seed0: str | None = None) -> dict[int, Path]:
    """``{seed: run folder}`` of one layout, in seed order: ``folder/<prefix><S>/`` is seed ``S`` and, when given,
    ``folder/<seed0>/`` seed 0 (the first setting's ``fedblend/`` + ``fedblend-seed<S>/``); only existing
    folders."""
    dirs = {int(p.name.removeprefix(prefix)): p for p in folder.glob(prefix + "*")
            if p.name.removeprefix(prefix).isdigit() and p.is_dir()}
    if seed0 is not None and (folder / seed0).is_dir():
        dirs[0] = folder / seed0
    return dict(sorted(dirs.items()))


def _finished_curves(dirs: Mapping[int, Path], key: str) -> dict[int, Curve]:
    curves = {seed: _run_curve(run, key) for seed, run in dirs.items()}
    return {seed: c for seed, c in curves.items() if c is not None}


def fedblend_curves(folder: Path, key: str = "acc") -> dict[int, Curve]:
    """``{seed: curve}`` of the finished runs ``folder/seed*/`` (the second setting's layout; accuracy in %)."""
    return _finished_curves(seed_dirs(folder, "seed"), key)


def second_setting_curves(folder: Path, key: str = "acc") -> dict[int, Curve]:
    """``{seed: curve}`` of a method folder in the second setting's layout: ``<method>/fedblend/seed*/``."""
    return fedblend_curves(folder / "fedblend", key)


def first_setting_curves(folder: Path, key: str = "acc") -> dict[int, Curve]:
    """``{seed: curve}`` in the first setting's layout (docs/validation.md): ``fedblend/`` is seed 0 and
    ``fedblend-seed1/``, ``fedblend-seed2/`` the other seeds, each run with the method's validation config."""
    return _finished_curves(seed_dirs(folder, "fedblend-seed", "fedblend"), key)


def reference_curves(path: Path) -> list[Curve]:
    """The reference's runs from ``reference.json`` that did not diverge (:func:`reference_diverged`): ``runs`` = one
    list of per-round accuracies (fractions, round 1 first) per repetition; a reference recorded before
    repetitions (the first setting's single run, ``acc``) is one run."""
    ref = json.loads(path.read_text())
    runs = ref["runs"] if "runs" in ref else ([ref["acc"]] if "acc" in ref else [])
    bad = ref.get("runs_nonfinite_loss") or [False] * len(runs)
    return [{i + 1: 100 * a for i, a in enumerate(run)} for run, b in zip(runs, bad, strict=True) if not b]


def reference_diverged(path: Path) -> int:
    """How many of the reference's runs diverged: a loss they recorded is not finite (``runs_nonfinite_loss``,
    written by the reference collector; absent: none was seen)."""
    return sum(bool(b) for b in json.loads(path.read_text()).get("runs_nonfinite_loss") or [])


def budget_of(curves: Sequence[Curve]) -> int:
    """The rounds of a setting's runs: the last round of each, which must be the same for all (a 50-round run
    compared with a 20-round reference is an error, not a shorter comparison)."""
    lasts = {max(c) for c in curves}
    if len(lasts) != 1:
        raise ValueError(f"runs of different budgets ({sorted(lasts)} rounds): one setting has one budget")
    return lasts.pop()


def method_sides(folder: Path, layout=second_setting_curves) -> tuple[list[Curve], list[Curve]]:
    """One method's finished runs, (fedblend's as ``layout`` reads them, the reference's): fedblend's metric is
    the one ``reference.json`` names in ``fedblend_metric`` (default ``acc``)."""
    ref = folder / "reference.json"
    key = json.loads(ref.read_text()).get("fedblend_metric", "acc")
    return list(layout(folder, key).values()), reference_curves(ref)


@dataclass(frozen=True)
class Verdict:
    """Rules 1-3 applied to one method of one setting; ``curve`` and ``orders`` are None when a side diverges."""
    runs: tuple[int, int]  # (fedblend, reference): every run, diverged ones included
    curve: CurveAgreement | None
    orders: tuple[tuple[float, float, bool], ...] | None  # against Local, against FedAvg: (ours, theirs, holds)
    diverged: tuple[int, int] = (0, 0)  # (fedblend, reference) runs that diverged

    @property
    def diverges(self) -> tuple[bool, bool]:
        """Rule 3: whether more than half of each side's runs diverged."""
        return self.diverged[0] * 2 > self.runs[0], self.diverged[1] * 2 > self.runs[1]

    @property
    def agrees(self) -> bool:
        if any(self.diverges):
            return all(self.diverges)
        return self.curve.agrees and all(o[2] for o in self.orders)

    @property
    def word(self) -> str:
        ours, theirs = self.diverges
        if ours or theirs:
            return {(True, True): "agrees (both diverge)", (True, False): "differs (fedblend diverges)",
                    (False, True): "differs (the reference diverges)"}[(ours, theirs)]
        return "agrees" if self.agrees else "differs"

    @property
    def runs_cell(self) -> str:
        """``fedblend / reference`` run counts, with the diverged ones named."""
        return " / ".join(f"{n}" + (f" ({d} diverged)" if d else "") for n, d in zip(self.runs, self.diverged))

    @property
    def inside_cell(self) -> str:
        return "-" if self.curve is None else f"{self.curve.inside} of {self.curve.of}"


def verdicts(root: Path, layout=second_setting_curves) -> dict[str, Verdict]:
    """The verdict of every method folder under ``root`` that has both sides (fedblend's runs as ``layout``
    reads them, the reference's ``reference.json``), once the anchors (``local/``, ``fedavg/``) have both sides
    too. fedblend's metric is the one ``reference.json`` names in ``fedblend_metric`` (default ``acc``: the
    reference's curve measures that model); the window and the final rounds follow the runs' budget
    (:func:`budget_of`); diverged runs follow rule 3 (``layout`` names its diverged-run reader,
    :data:`DIVERGED`)."""
    if not all((root / a / "reference.json").exists() for a in ("local", "fedavg")):
        return {}
    anchors = [method_sides(root / a, layout) for a in ("local", "fedavg")]
    if not all(ours and theirs for ours, theirs in anchors):
        return {}
    out = {}
    for folder in sorted(p for p in root.iterdir() if (p / "reference.json").exists()):
        ours, theirs = method_sides(folder, layout)
        diverged = (len(DIVERGED[layout](folder)), reference_diverged(folder / "reference.json"))
        runs = (len(ours) + diverged[0], len(theirs) + diverged[1])
        if not runs[0] or not runs[1]:
            continue
        verdict = Verdict(runs, None, None, diverged)
        if not any(verdict.diverges):
            budget = budget_of([*ours, *theirs, *(c for side in anchors for runs in side for c in runs)])
            orders = tuple(same_ordering(ours, a_ours, theirs, a_theirs, budget) for a_ours, a_theirs in anchors)
            verdict = Verdict(runs, curve_agreement(ours, theirs, budget), orders, diverged)
        out[folder.name] = verdict
    return out


def verdict_rows(root: Path, layout=second_setting_curves) -> list[str]:
    """One markdown row per method of :func:`verdicts`."""
    rows = []
    for name, v in verdicts(root, layout).items():
        cells = ["-", "-"] if v.orders is None else [f"{o[0]:+.2f} / {o[1]:+.2f}" for o in v.orders]
        d_last = "-" if v.curve is None else f"{v.curve.d_last:+.2f}"
        rows.append(f"| {name} | {v.runs_cell} | {d_last} | {v.inside_cell} | {cells[0]} | {cells[1]} | **{v.word}** |")
    return rows


VERDICT_HEAD = ("| method | runs (fedblend / reference) | d at the last round | rounds inside the band | vs Local (ours / "
                "theirs) | vs FedAvg (ours / theirs) | verdict |\n|---|---|---|---|---|---|---|")
PAIRED_HEAD = ("| method | seeds | final accuracy % (mean ± sd) | minus Local: mean [95 % interval] | minus FedAvg-FT: "
               "mean [95 % interval] | against Local |\n|---|---|---|---|---|---|")
ANCHORS = ("local", "fedavg-ft")


def _interval(res: tuple[float, float, float, int]) -> str:
    mean, low, high, _ = res
    return f"{mean:+.2f}" + ("" if math.isnan(low) else f" [{low:+.2f}, {high:+.2f}]")


def _against_local(res: tuple[float, float, float, int]) -> str:
    """What the paired interval against Local says: a port that degrades to Local has one around zero."""
    mean, low, high, n = res
    if n < 2:
        return f"{n} seed: no interval"
    if low <= 0 <= high:
        return "**not told apart from Local**"
    return "above Local" if mean > 0 else "below Local"


def _diverged(dirs: Mapping[int, Path]) -> dict[int, int | None]:
    """``{seed: round}`` of the runs among ``dirs`` that the divergence check stopped (a result, named in the
    tables, never averaged)."""
    out = {}
    for seed, run in dirs.items():
        summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
        if summary.get("status") == "diverged":
            out[seed] = (summary.get("divergence") or {}).get("round")
    return out


def diverged_seeds(folder: Path) -> dict[int, int | None]:
    """:func:`_diverged` of the runs ``folder/seed*/`` (the second setting's layout)."""
    return _diverged(seed_dirs(folder, "seed"))


def first_setting_diverged(folder: Path) -> dict[int, int | None]:
    """:func:`_diverged` in the first setting's layout (``fedblend/`` seed 0, ``fedblend-seed<S>/``)."""
    return _diverged(seed_dirs(folder, "fedblend-seed", "fedblend"))


DIVERGED = {second_setting_curves: lambda folder: diverged_seeds(folder / "fedblend"),
            first_setting_curves: first_setting_diverged}


def _diverged_note(diverged: dict[int, int | None]) -> str:
    return "; ".join(f"seed {s} diverged (round {r})" for s, r in sorted(diverged.items()))


def paired_rows(root: Path) -> list[str]:
    """One markdown row per method folder under ``root`` with finished fedblend runs (``<method>/fedblend/seed*``):
    its final accuracy over seeds, and the paired differences (:func:`paired`) from Local and from FedAvg-FT
    (``local/``, ``fedavg-ft/``, themselves without a row); diverged seeds are named, never averaged (a method
    whose every run diverged has a row that says so). Empty until both anchors have runs."""
    anchors = {a: fedblend_curves(root / a / "fedblend") for a in ANCHORS}
    if not all(anchors.values()):
        return []
    rows = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name not in ANCHORS):
        ours, diverged = fedblend_curves(folder / "fedblend"), diverged_seeds(folder / "fedblend")
        if not ours:
            if diverged:
                rows.append(f"| {folder.name} | 0 | - | - | - | {_diverged_note(diverged)} |")
            continue
        budget = budget_of([*ours.values(), *(c for a in anchors.values() for c in a.values())])
        mean, sd = _mean_sd([final(c, budget) for c in ours.values()])
        vs = [paired(ours, anchors[a], budget=budget) for a in ANCHORS]
        note = "; ".join(x for x in (_against_local(vs[0]), _diverged_note(diverged)) if x)
        rows.append(f"| {folder.name} | {len(ours)} | {mean:.2f} ± {sd:.2f} | {_interval(vs[0])} | {_interval(vs[1])} "
                    f"| {note} |")
    return rows


def render_verdicts(root: Path) -> str:
    """The verdict table (rule 1 and 2) as docs/validation-2.md shows it."""
    rows = verdict_rows(root) if root.exists() else []
    return VERDICT_HEAD + ("\n" + "\n".join(rows) if rows else "")


def render_paired(root: Path) -> str:
    """The paired table (each method against Local and FedAvg-FT) as docs/validation-2.md shows it."""
    rows = paired_rows(root) if root.exists() else []
    return PAIRED_HEAD + ("\n" + "\n".join(rows) if rows else "")


BOTH_HEAD = ("| method | first setting: runs (fedblend / reference) | rounds inside the band | verdict | second setting: "
             "runs (fedblend / reference) | rounds inside the band | verdict |\n|---|---|---|---|---|---|---|")


def render_both(first: Path, second: Path) -> str:
    """Each baseline's verdict in both settings (docs/validation.md): the rule applied to ``first`` (the first
    setting's layout, :func:`first_setting_curves`) and to ``second`` (:func:`second_setting_curves`); a method
    with a ``reference.json`` in either setting has a row, "-" where a side's runs are not there yet."""
    sets = [verdicts(first, first_setting_curves) if first.exists() else {},
            verdicts(second) if second.exists() else {}]
    names = sorted({p.name for root in (first, second) if root.exists() for p in root.iterdir()
                    if (p / "reference.json").exists() and "status" not in json.loads((p / "reference.json").read_text())})
    rows = []
    for name in names:
        cells = []
        for vs in sets:
            v = vs.get(name)
            cells += ["-", "-", "-"] if v is None else [v.runs_cell, v.inside_cell, f"**{v.word}**"]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return BOTH_HEAD + ("\n" + "\n".join(rows) if rows else "")


# ------------------------------------------------------------------------------------ paired by initial model
INIT_HEAD = ("| method | pairs (reference repetition = fedblend run from its initial model) | mean difference over the "
             "rounds, each pair | largest difference (round), each pair | last round: ours / reference %, each pair |"
             "\n|---|---|---|---|---|")


def init_pairs(folder: Path) -> dict[int, tuple[Curve, Curve]]:
    """``{S: (fedblend, reference)}``: fedblend's runs from the reference's repetition-``S`` initial model
    (``fedblend-pflib-init/`` for S = 0, ``fedblend-pflib-init-seed<S>/``) with that repetition's curve. A
    repetition ``S > 0`` pairs only when the reference seeded its repetitions by index (``runs_seeding`` in
    ``reference.json``; unseeded, PFLlib's later repetitions do not start from seed ``S``'s draw)."""
    ref = json.loads((folder / "reference.json").read_text())
    runs = ref.get("runs") or ([ref["acc"]] if "acc" in ref else [])
    key = ref.get("fedblend_metric", "acc")
    ours = _finished_curves(seed_dirs(folder, "fedblend-pflib-init-seed", "fedblend-pflib-init"), key)
    return {seed: (curve, {i + 1: 100 * a for i, a in enumerate(runs[seed])}) for seed, curve in ours.items()
            if seed < len(runs) and (seed == 0 or "runs_seeding" in ref)}


def render_init_pairs(root: Path) -> str:
    """fedblend from each reference repetition's own initial model, against that repetition, round by round
    (docs/validation.md): what is left when the initial draw is the same on both sides."""
    rows = []
    for folder in sorted(p for p in root.iterdir() if (p / "reference.json").exists()) if root.exists() else []:
        pairs = init_pairs(folder)
        if not pairs:
            continue
        means, largest, last = [], [], []
        for _seed, (ours, theirs) in pairs.items():
            rounds = sorted(set(ours) & set(theirs))
            d = {r: ours[r] - theirs[r] for r in rounds}
            worst = max(rounds, key=lambda r: abs(d[r]))
            means.append(f"{statistics.fmean(d.values()):+.2f}")
            largest.append(f"{d[worst]:+.2f} ({worst})")
            last.append(f"{ours[rounds[-1]]:.2f} / {theirs[rounds[-1]]:.2f}")
        rows.append(f"| {folder.name} | {', '.join(map(str, pairs))} | {'; '.join(means)} | {'; '.join(largest)} "
                    f"| {'; '.join(last)} |")
    return INIT_HEAD + ("\n" + "\n".join(rows) if rows else "")


# ------------------------------------------------------------------------------------------------ collecting runs
RUN_FILES = ("config.toml", "summary.json", "metrics.jsonl")


def collect(runs: Path, results: Path) -> tuple[list[Path], list[Path]]:
    """Copy the finished fedblend runs of both settings from a campaign's ``runs`` folder into ``results``, each
    into its setting's layout: ``runs/validation-2/<method>/seed<S>/`` -> ``validation-2/<method>/fedblend/seed<S>/``
    and ``runs/validation/<method>/seed<S>/`` -> ``validation/<method>/fedblend/`` (seed 0) or
    ``fedblend-seed<S>/`` (:func:`first_setting_curves`). A run already in ``results`` is left as it is (returned
    second); one still running or cut is not copied, one the divergence check stopped is (a result)."""
    import shutil

    copied, kept = [], []
    for setting, target in (("validation-2", lambda m, s: results / "validation-2" / m / "fedblend" / f"seed{s}"),
                            ("validation", lambda m, s: results / "validation" / m / (
                                "fedblend" if s == 0 else f"fedblend-seed{s}"))):
        for run in sorted((runs / setting).glob("*/seed*")):
            seed = run.name.removeprefix("seed")
            status = json.loads((run / "summary.json").read_text()).get("status") if (run / "summary.json").exists() else None
            if not seed.isdigit() or not run.is_dir() or status not in ("finished", "diverged"):
                continue
            out = target(run.parent.name, int(seed))
            if out.exists():
                kept.append(out)
                continue
            out.mkdir(parents=True)
            for f in RUN_FILES:
                shutil.copy2(run / f, out / f)
            copied.append(out)
    return copied, kept


def rounds_report(folder: Path, layout=second_setting_curves) -> str:
    """Round by round, what rule 1 sees for one method: each fedblend run's and each reference run's accuracy,
    ``d(r)``, the band ``2 se(r) + FLOOR`` and whether the round is inside it; rounds of the window are marked
    ``*``. For reading a curve before writing what a verdict means; the verdict itself is :func:`verdicts`'."""
    ours, theirs = method_sides(folder, layout)
    if not ours or not theirs:
        raise ValueError(f"{folder}: needs finished runs on both sides ({len(ours)} fedblend, {len(theirs)} reference)")
    budget = budget_of([*ours, *theirs])
    window_rounds = set(window(budget)[0])
    lines = [f"{folder}: {len(ours)} fedblend / {len(theirs)} reference runs, {budget} rounds (* = rule 1's window)",
             "round | fedblend runs | reference runs | d | band | inside"]
    for r in range(1, budget + 1):
        d, band = round_gap(ours, theirs, r)
        runs = [" ".join(f"{c[r]:6.2f}" for c in side) for side in (ours, theirs)]
        lines.append(f"{r:4d}{'*' if r in window_rounds else ' '} | {runs[0]} | {runs[1]} | {d:+6.2f} | {band:5.2f} | "
                     f"{'yes' if abs(d) <= band else 'NO'}")
    return "\n".join(lines)


SEEDS = (0, 1, 2)  # three runs a side


def _tables():
    """bookkeeping/tables.py (not a package: loaded from its path), for its run-header and run-cost readers."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fedblend_tables", Path(__file__).with_name("tables.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fedblend_tables", mod)
    spec.loader.exec_module(mod)
    return mod


def left(configs: Path, results: Path, out_root: str = "runs") -> list[str]:
    """What the second setting still lacks: for each ``configs/<method>.toml``, fedblend's missing seeds of
    :data:`SEEDS` as queue lines for ``bookkeeping/campaign.py`` (``MINUTES<TAB>COMMIT<TAB>COMMAND``: the method's
    committed runs' commit and mean minutes, else ``HEAD`` and ``?``; a seed that exists but did not finish counts
    as missing), then one comment line per method whose first setting has a reference but whose
    ``reference.json`` here has fewer than three runs (the reference side is run by hand: docs/validation-2.md)."""
    tables, lines, refs = _tables(), [], []
    for config in sorted(configs.glob("*.toml")):
        method = config.stem
        runs = results / method / "fedblend"
        have = set(fedblend_curves(runs)) | set(diverged_seeds(runs))
        done = [runs / f"seed{s}" for s in sorted(have)]
        commit = next((c.removesuffix("+dirty") for d in done if (d / "config.toml").exists()
                       and (c := tables.header_field(d / "config.toml", "git_commit"))), "HEAD")
        minutes = tables.run_minutes([json.loads((d / "summary.json").read_text()) for d in done])
        cost = "?" if minutes is None else f"{minutes:.0f}"
        for seed in (s for s in SEEDS if s not in have):
            lines.append(f"{cost}\t{commit}\tfedblend run {config.as_posix()} --set seed={seed} "
                         f"--out {out_root}/validation-2/{method}/seed{seed}")
        ref, first = results / method / "reference.json", results.parent / "validation" / method / "reference.json"
        n = len(json.loads(ref.read_text()).get("runs", [])) if ref.exists() else 0
        if first.exists() and "acc" in json.loads(first.read_text()) and n < len(SEEDS):
            refs.append(f"# reference {method}: {n} of {len(SEEDS)} runs in {ref}")
    return lines + refs


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["rounds"]:  # validation2.py rounds results/validation[-2]/<method>
        folder = Path(args[1])
        print(rounds_report(folder, first_setting_curves if folder.parent.name == "validation" else second_setting_curves))
        return 0
    if args[:1] == ["collect"]:  # validation2.py collect RUNS [RESULTS]
        copied, kept = collect(Path(args[1]), Path(args[2] if len(args) > 2 else "results"))
        print("\n".join([*map(str, copied), *(f"{p}: already there, left as it is" for p in kept)]))
        return 0
    if args[:1] == ["left"]:  # validation2.py left [CONFIGS [RESULTS]]
        configs = Path(args[1] if len(args) > 1 else "configs/validation-2")
        print("\n".join(left(configs, Path(args[2] if len(args) > 2 else "results/validation-2"))))
        return 0
    root = Path((args or ["results/validation-2"])[0])
    print(render_verdicts(root) + "\n\n" + render_paired(root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
