"""Results are data, tables are generated: build the tables of docs/benchmarks.md and docs/validation.md from
the runs committed under ``results/``.

Layout of ``results/`` (each run folder holds only ``config.toml``, ``summary.json`` and ``metrics.jsonl``):

    results/<table>/<column>/<row>/seed<S>/     a benchmark run (row = the run's method, e.g. ``ditto``, ``fedavg+ala``)
    results/validation/<method>/fedblend/        fedblend's side of a side-by-side run
    results/validation/<method>/fedblend-<variant>/  the same with other seeds (seed1, ...), the reference's
                                                 initial weights (pflib-init), its options and initial weights
                                                 (as-reference) or its options alone (reference-options)
    results/validation/<method>/reference.json   the reference implementation's per-round accuracy (+ where from);
                                                 without ``acc``, a method with no reference to run: its
                                                 ``status`` (e.g. "no public reference") fills the row
    results/validation/<method>/verdict.md       the verdict in words (one paragraph)
    results/probes/<table>/<column>/<name>/seed<S>/  a probe run a doc cites (no generated table)

A generated table sits in a doc between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``; nothing between the
markers is typed by hand.

    python bookkeeping/tables.py                      # rewrite every generated block in place
    python bookkeeping/tables.py --check              # exit 1 naming each block that differs from results/
    python bookkeeping/tables.py collect SWEEP_DIR results/t3/pat   # copy a sweep's finished runs into results/
    python bookkeeping/tables.py left                 # the campaigns' rows that still miss seeds (GOALS)
    python bookkeeping/tables.py left --commands      # the commands that run them (MINUTES, COMMIT, COMMAND)
    python bookkeeping/tables.py collect-left runs    # their finished runs, each into its table's results folder

``tests/bookkeeping/test_docs_tables.py`` runs the check, so a number in the docs that results/ does not give fails the suite.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fedblend.results.stats import mean_std_cell, paired_stats

REPO = Path(__file__).resolve().parents[1]
RUN_FILES = ("config.toml", "summary.json", "metrics.jsonl")


# ------------------------------------------------------------------------------------------------ specs
@dataclass(frozen=True)
class Row:
    """One method's row: ``key`` is its folder under each column (the run's method name), ``metric`` the summary
    field reported (personalized best accuracy unless the paper reports the global model), ``paper`` the published
    number per column; ``folder`` reads the runs of another folder instead (FedAvg's global model from the
    FedAvg-FT runs, which train exactly like FedAvg: ``tests/test_fedavg.py`` checks it bit for bit); ``root``
    reads them under another table's results root (``results/t1``: a row whose runs are another table's runs of
    the same config and column, e.g. the ALA table's FedPHP host, which is T1's FedPHP row), so one run is
    committed once; ``columns`` (when not empty) names the only columns the row applies to, and its cell in
    the others reads "n/a" (T4's transfer row: an agent pre-trained on another dataset than the column's);
    ``config`` (with ``{column}`` for the column) makes it a row of its own config, not the table's shared
    settings: a method with the settings its authors give where the shared ones break it, which stands beside
    that method's shared-setting row ``beside`` and is shown only once it has a run (:meth:`shown`), and whose
    missing seeds ``left --commands`` runs from that config (:func:`recipe`)."""

    key: str
    label: str
    paper: dict[str, float] = field(default_factory=dict)
    metric: str = "best_accuracy"
    folder: str | None = None
    root: str | None = None
    columns: tuple[str, ...] = ()
    config: str | None = None
    beside: str | None = None

    def applies(self, column: str) -> bool:
        return not self.columns or column in self.columns

    def shown(self, table: Table, repo: Path) -> bool:
        """Every row is shown, but a row of its own config (``config``) only once a column has a run of it
        (finished or diverged): until then the table stays as its shared-setting rows give it."""
        return not self.config or any(self.runs(table, c, repo, st) for c, _ in table.columns if self.applies(c)
                                      for st in ("finished", "diverged"))

    @property
    def where(self) -> str:
        return self.folder or self.key

    def runs(self, table: Table, column: str, repo: Path, status: str = "finished") -> list[dict]:
        """The row's runs of ``column`` (:func:`load_runs`), under its own root or the table's."""
        return load_runs(repo / (self.root or table.root) / column / self.where, status)


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    root: str
    columns: tuple[tuple[str, str], ...]
    rows: tuple[Row, ...]
    gains: bool = False  # ALA tables: a "gain" cell for X+ala rows over X
    scale: float = 100.0  # cell values are the metric times this (accuracies in %; 1.0 for rounds)
    missing: str = "-"  # a finished run whose metric is null (e.g. a target never reached)
    digits: int = 2  # decimals of a cell's mean and std (1 for rounds)


def _paper(pat: float | None, dr: float | None) -> dict[str, float]:
    return {k: v for k, v in (("pat", pat), ("dir", dr)) if v is not None}


T1 = Table("t1", "docs/benchmarks.md", "results/t1", (("pat", "pathological"), ("dir", "Dir(0.1)")), (
    Row("fedavg", "FedAvg (global model)", _paper(75.08, 86.96), "global_best_accuracy", folder="fedavg-ft"),
    Row("fedphp", "FedPHP", _paper(99.17, 95.33)),
    Row("fedamp", "FedAMP", _paper(99.26, 96.44)),
    Row("apple", "APPLE", _paper(99.06, 95.42)),
    Row("apple-own", "APPLE (authors' optimiser: SGD momentum 0.9, core lr 0.01, DR lr 0.001)", _paper(99.06, 95.42),
        config="configs/benchmarks/t1-fmnist-{column}-apple-own.toml", beside="apple"),
    Row("fedala", "FedALA", _paper(99.33, 96.19)),
    Row("pfedhn", "pFedHN", _paper(99.29, 95.95)),
    Row("pfedla", "pFedLA", _paper(98.85, 95.30)),
    Row("fedpac", "FedPAC", _paper(99.41, 96.36)),
    Row("dbe", "DBE", _paper(99.20, 95.97)),
    Row("dbe-own", "DBE (authors' settings: SGD without momentum)", _paper(99.20, 95.97), columns=("pat",),
        config="configs/benchmarks/t1-fmnist-{column}-dbe-own.toml", beside="dbe"),
    Row("fedproto", "FedProto", _paper(99.31, 95.52)),
    Row("fedgh", "FedGH", _paper(99.32, 95.22)),
    Row("fedapa", "FedAPA", _paper(99.35, 96.71)),
    Row("fedavg-ft", "FedAvg-FT (1 epoch fine-tuning)"),
    Row("local", "Local-only"),
))

T3 = Table("t3", "docs/benchmarks.md", "results/t3", (("pat", "pathological"),), (
    Row("fedavg", "FedAvg (global model)", {"pat": 97.93}, "global_best_accuracy", folder="fedavg-ft"),
    Row("fedavg-ft", "FedAvg-C (FedAvg-FT, 1 epoch fine-tuning)", {"pat": 99.79}),
    Row("ditto", "Ditto", {"pat": 99.81}),
    Row("fedrep", "FedRep", {"pat": 99.77}),
    Row("fedala", "FedALA", {"pat": 99.88}),
))

ALA_HOSTS = ("fedavg", "fedprox", "ditto", "fedrep", "fedphp", "fedamp", "perfedavg", "pfedme", "partialfed")
#: ALA-table rows that are T1 Dir(0.1) runs of the same config (``t1-fmnist-dir-fedavg.toml`` with the method set),
#: read from ``results/t1`` instead of being run twice: FedAvg's global model is the FedAvg-FT runs' (as T1's
#: FedAvg row), ``fedavg+ala`` is FedALA (``tests/test_fedala.py``: the same histories bit for bit, ALA's defaults
#: in both), FedPHP and FedAMP are T1's rows
ALA_FROM_T1 = {"fedavg": "fedavg-ft", "fedavg+ala": "fedala", "fedphp": "fedphp", "fedamp": "fedamp"}
ALA = Table("ala", "docs/benchmarks.md", "results/ala", (("dir", "T1 Dir(0.1)"),), tuple(
    Row(key, key + (f" (T1's {ALA_FROM_T1[key]} runs)" if key in ALA_FROM_T1 else ""), {},
        "global_best_accuracy" if key in ("fedavg", "fedprox") else "best_accuracy",
        folder=ALA_FROM_T1.get(key), root="results/t1" if key in ALA_FROM_T1 else None)
    for host in ALA_HOSTS for key in (host, f"{host}+ala")), gains=True)

# T4 (pFedRLLA's protocol, issue #25: 100 clients, 10 % join, 5 local epochs; the budget is each run's `rounds`):
# columns are dataset-partition folders, rows the paper's baselines and pFedRLLA with / without its pre-trained
# agent (the row folder is the `collect --row` name). No published numbers here (its paper has no FMNIST / MNIST rows).
T4_COLUMNS = (("fmnist-pat2", "FMNIST pathological s = 2"), ("mnist-domains", "MNIST*"),
              ("fmnist-dir0.1", "FMNIST Dir(0.1)"))
# agent pre-trained on the column's dataset (App. D) -- the FMNIST agent on MNIST* is the transfer row (App. F.2's
# "new scenario": pre-trained on another dataset), which only the MNIST* column has
T4_ROWS = (("local", "Local-only"), ("fedavg", "FedAvg"), ("fedavg-ft", "FedAvg-FT"), ("fedala", "FedALA"),
           ("ditto", "Ditto"), ("apfl", "APFL"), ("fedbabu", "FedBABU"), ("fedphp", "FedPHP"),
           ("pfedrlla", "pFedRLLA (agent not pre-trained)"), ("pfedrlla-pretrained", "pFedRLLA (pre-trained agent)"),
           ("pfedrlla-transfer", "pFedRLLA (agent pre-trained on FMNIST s = 4: new scenario)"))
T4_ONLY = {"pfedrlla-transfer": ("mnist-domains",)}
T4_MINE = tuple(k for k, _ in T4_ROWS if k.startswith("pfedrlla"))  # the verdict's pFedRLLA rows
T4 = Table("t4", "docs/benchmarks.md", "results/t4", T4_COLUMNS,
           tuple(Row(k, label, columns=T4_ONLY.get(k, ())) for k, label in T4_ROWS))
T4_ROUNDS = Table("t4-rounds", "docs/benchmarks.md", "results/t4", T4_COLUMNS,
                  tuple(Row(k, label, metric="rounds_to_target", columns=T4_ONLY.get(k, ())) for k, label in T4_ROWS),
                  scale=1.0, missing="target not reached", digits=1)

# T4 at the paper's 500 rounds (issue #51): FMNIST pathological s = 2, each row's 100-round config
# (``results/t4/fmnist-pat2/<row>/seed0/config.toml``) run to 500 rounds (:func:`recipe`), one seed; the rows the
# paper's claim is about (pFedRLLA with and without its pre-trained agent) and the two best baselines at 100 rounds.
T4_500_ROWS = ("fedavg-ft", "fedphp", "pfedrlla", "pfedrlla-pretrained")
T4_500 = Table("t4-500", "docs/benchmarks.md", "results/t4-500", (("fmnist-pat2", "FMNIST pathological s = 2"),),
               tuple(Row(k, label) for k, label in T4_ROWS if k in T4_500_ROWS))

# T4's ablations (issue #25; pFedRLLA Table 2 / 7: which part the agent or the size weights aggregate; Table 5: one
# reward weight at zero; Fig. 6: the embedding), FMNIST pathological s = 2 at the T4 budget. Runs are collected with
# ``collect RUNS results/t4/ablations/fmnist-pat2 --row pfedrlla-<variant>``; "Both" is T4's pFedRLLA row.
T4_ABLATIONS = Table("t4-ablations", "docs/benchmarks.md", "results/t4/ablations",
                     (("fmnist-pat2", "FMNIST pathological s = 2"),), (
    Row("pfedrlla-none", "None: body and head averaged (FedAvg's aggregation)"),
    Row("pfedrlla-body", "Body: body by data size, head averaged"),
    Row("pfedrlla-head", "Head: body averaged, head by the agent"),
    Row("pfedrlla", "Both: pFedRLLA (body by data size, head by the agent)", root="results/t4"),
    Row("pfedrlla-drl", "DRL: the agent's weights on the whole network"),
    Row("pfedrlla-b1zero", "reward weights (0, 1, 2): no r1 (accuracy)"),
    Row("pfedrlla-b2zero", "reward weights (1, 0, 2): no r2"),
    Row("pfedrlla-b3zero", "reward weights (1, 1, 0): no r3"),
    Row("pfedrlla-pca", "embedding: PCA of the flattened head"),
    Row("pfedrlla-flat", "embedding: MLP auto-encoder (not the multi-head LSTM one)"),
))
#: BP / AP of the ablation table: the mean over the last rounds of a run of ``bp_acc`` / ``ap_acc`` (each round's
#: participants pooled, before / after their local training), so that about every client is counted once
ABLATION_LAST = 10

# T2 (FedALP Table 2: 100 one-class clients, MNIST-NN, 600 rounds): columns are the datasets, rows FedAvg, FedALP's
# global and local (personalized) models, FedAvg on IID data, and FedALP with M = 3 (not in the paper). Runs are
# collected with ``collect RUNS results/t2/<mnist|fmnist> --row <fedavg|fedalp|fedavg-iid|fedalp-m3>``.
T2 = Table("t2", "docs/benchmarks.md", "results/t2", (("mnist", "MNIST"), ("fmnist", "FMNIST")), (
    Row("fedavg", "FedAvg", {"mnist": 87.25, "fmnist": 73.48}),
    Row("fedalp-global", "FedALP global", {"mnist": 86.65, "fmnist": 72.81}, "global_best_accuracy", folder="fedalp"),
    Row("fedalp", "FedALP local", {"mnist": 94.46, "fmnist": 96.64}),
    Row("fedavg-iid", "FedAvg IID", {"mnist": 94.37, "fmnist": 81.05}),
    Row("fedalp-m3-global", "FedALP global, M = 3", {}, "global_best_accuracy", folder="fedalp-m3"),
    Row("fedalp-m3", "FedALP local, M = 3"),
))

# T2's MNIST-CNN rows (issue #51): the same protocol with FedALP's MNIST-CNN (``cnn5``), 600 rounds; one config per
# row and column, ``configs/benchmarks/t2-<column>-cnn5-<row>.toml`` (:func:`recipe`), one seed (about two hours a run).
T2_CNN = Table("t2-cnn", "docs/benchmarks.md", "results/t2-cnn", (("mnist", "MNIST"), ("fmnist", "FMNIST")), (
    Row("fedavg", "FedAvg", {"mnist": 92.55, "fmnist": 68.86}),
    Row("fedalp-global", "FedALP global", {"mnist": 91.86, "fmnist": 65.01}, "global_best_accuracy", folder="fedalp"),
    Row("fedalp", "FedALP local", {"mnist": 96.67, "fmnist": 79.67}),
    Row("fedavg-iid", "FedAvg IID", {"mnist": 96.04, "fmnist": 80.99}),
))

#: the README's headline rows: T1's FedAvg, FedALA and FedAPA rows and its two references, from results/t1
SUMMARY = Table("summary", "README.md", T1.root, T1.columns,
                tuple(r for r in T1.rows if r.key in ("fedavg", "fedala", "fedapa", "fedavg-ft", "local")))

TABLES = {t.name: t for t in (T1, T2, T2_CNN, T3, ALA, T4, T4_ROUNDS, SUMMARY)}


# ------------------------------------------------------------------------------------------------ reading
def load_runs(folder: Path, status: str = "finished") -> list[dict]:
    """The summaries of the runs under ``folder`` (one per ``seed*`` subfolder) whose status is ``status``
    (``"finished"``: the runs a cell averages; ``"diverged"``: runs stopped by the divergence check, which a cell
    names and never averages), sorted by seed."""
    out = []
    for s in sorted(folder.glob("seed*/summary.json")):
        summary = json.loads(s.read_text())
        if summary.get("status", "finished") == status:
            out.append(summary)
    return sorted(out, key=lambda s: s["seed"])


def diverged_note(runs: list[dict]) -> str:
    """``diverged: seed 0 (round 3)``: the seeds whose run stopped on a non-finite or exploding value, with the
    round the summary's ``divergence`` names."""
    if not runs:
        return ""
    seeds = ", ".join(f"{s['seed']} (round {s.get('divergence', {}).get('round', '?')})" for s in runs)
    return f"diverged: seed{'s' if len(runs) > 1 else ''} {seeds}"


def cell(summaries: list[dict], metric: str, paper: float | None, scale: float = 100.0, missing: str = "-",
         diverged: list[dict] | None = None, digits: int = 2) -> str:
    """``mean ± std`` (sample std over seeds) of the metric times ``scale`` (% by default), the seed count when
    under 3, the paper's number in brackets; runs whose metric is null are counted as ``missing`` (e.g. "not
    reached: 2 of 3 seeds"); ``diverged`` runs are named with their seed and round, never averaged."""
    vals = [s.get(metric) for s in summaries]
    nulls = sum(v is None for v in vals)
    vals = [v for v in vals if v is not None]
    note = diverged_note(diverged or [])
    if not summaries and note:
        text = note
        note = ""
    elif not summaries:
        text = "not run"
    elif not vals:
        text = missing
    else:
        text = mean_std_cell(vals, scale, digits)
    if vals and len(vals) < 3:
        text += f" ({len(vals)} seed{'s' if len(vals) > 1 else ''})"
    if vals and nulls:
        text += f"; {missing}: {nulls} of {len(summaries)} seeds"
    if note:
        text += f"; {note}"
    return text + (f" [{paper:.2f}]" if paper is not None else "")


def gain_cell(host: list[dict], hosted: list[dict], host_metric: str) -> str:
    """(X+ala best) - (X's reported metric), in points, paired over the seeds both have: the mean, its 95 %
    Student-t interval from two seeds on, and each seed's gain (:func:`paired_cell`)."""
    return paired_cell(hosted, host, "best_accuracy", host_metric, per_seed=True)


def paired_values(runs: list[dict], anchor: list[dict], metric: str, anchor_metric: str,
                  scale: float = 100.0) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The seeds where both the row (``metric``) and the anchor (``anchor_metric``) have a value, and the two
    value arrays over them, times ``scale``."""
    a = {s["seed"]: s.get(metric) for s in runs}
    b = {s["seed"]: s.get(anchor_metric) for s in anchor}
    seeds = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
    return (seeds, np.array([a[k] for k in seeds], dtype=float) * scale,
            np.array([b[k] for k in seeds], dtype=float) * scale)


def paired_cell(runs: list[dict], anchor: list[dict], metric: str, anchor_metric: str, level: float = 0.95,
                scale: float = 100.0, digits: int = 2, per_seed: bool = False) -> str:
    """Row minus anchor, paired by seed over the seeds where both have a value (points by default; ``scale = 1``
    for counts such as ``rounds_to_target``): the mean difference, its Student-t interval with two or more paired
    seeds (``fedblend report --compare``'s :func:`paired_stats`), and the seed count, or with ``per_seed`` each
    seed's difference in its place (the count alone is dropped at one seed)."""
    seeds, a, b = paired_values(runs, anchor, metric, anchor_metric, scale)
    if not seeds:
        return "-"
    res = paired_stats(a, b, seeds, level, "")
    text = f"{res['mean']:+.{digits}f}"
    if res["ci"]:
        text += f" [{res['ci'][0]:+.{digits}f}, {res['ci'][1]:+.{digits}f}]"
    if per_seed:
        return text if len(seeds) == 1 else text + (
            f" ({len(seeds)} seeds; per seed {' / '.join(f'{x:+.{digits}f}' for x in a - b)})")
    return text + f" ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"


def render_paired(table: Table, anchor: str, repo: Path = REPO, per_seed: bool = False) -> str:
    """Every row of ``table`` against the row ``anchor``, paired by seed, one column per setting (with
    ``per_seed``, each seed's difference too: the numbers prose quotes, so none is subtracted by hand)."""
    base = next(r for r in table.rows if r.key == anchor)
    lines = ["| method | " + " | ".join(f"{label}: minus {base.label}" for _, label in table.columns) + " |",
             "|" + "---|" * (len(table.columns) + 1)]
    for row in table.rows:
        if row.key == anchor or not row.shown(table, repo):
            continue
        cells = [paired_cell(row.runs(table, c, repo), base.runs(table, c, repo), row.metric, base.metric,
                             per_seed=per_seed) for c, _ in table.columns]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render(table: Table, repo: Path = REPO) -> str:
    head = ["method"] + [f"{label} [paper]" if any(c in r.paper for r in table.rows) else label
                         for c, label in table.columns]
    if table.gains:
        head += ["gain from ALA (points, paired by seed: mean [95 % interval])"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table.rows:
        if not row.shown(table, repo):
            continue
        cells = [row.label]
        for c, _ in table.columns:
            cells.append(cell(row.runs(table, c, repo), row.metric, row.paper.get(c), table.scale,
                              table.missing, row.runs(table, c, repo, "diverged"), table.digits)
                         if row.applies(c) else "n/a")
        if table.gains:
            if row.key.endswith("+ala"):
                host = next(r for r in table.rows if r.key == row.key[:-4])
                cells.append("; ".join(gain_cell(host.runs(table, c, repo), row.runs(table, c, repo), host.metric)
                                       for c, _ in table.columns))
            else:
                cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_metrics(table: Table, column: str, repo: Path = REPO) -> str:
    """One column of ``table``, a row per method and a cell per headline metric: best and final accuracy (%) and
    rounds to the run's target (T4 at 500 rounds, where one table of best accuracies would hide how fast)."""
    lines = ["| method | best % | final % | rounds to the target |", "|---|---|---|---|"]
    for row in table.rows:
        runs, diverged = row.runs(table, column, repo), row.runs(table, column, repo, "diverged")
        cells = [cell(runs, "best_accuracy", None, diverged=diverged), cell(runs, "final_accuracy", None, diverged=diverged),
                 cell(runs, "rounds_to_target", None, 1.0, "target not reached", diverged, 1)]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def render_verdict(table: Table, mine: tuple[str, ...], repo: Path = REPO) -> str:
    """Per column: the best of the ``mine`` rows (by the mean of its metric over seeds) against the best other row,
    and their difference paired by seed (:func:`paired_cell`). Issue #25's verdict per T4 column: is pFedRLLA
    above every baseline, and by how much."""
    lines = ["| column | best pFedRLLA row | best other row | difference, paired over seeds (points) | rounds to "
             "the target: difference, paired over the seeds where both reached it |", "|---|---|---|---|---|"]

    def best(rows: list[Row], c: str) -> tuple[Row, list[dict], float] | None:
        scored = []
        for r in rows:
            runs = [x for x in r.runs(table, c, repo) if x.get(r.metric) is not None]
            if runs:
                scored.append((r, runs, float(np.mean([x[r.metric] for x in runs]))))
        return max(scored, key=lambda t: t[2]) if scored else None

    def name(t: tuple[Row, list[dict], float] | None) -> str:
        return f"{t[0].label}: {t[2] * table.scale:.2f} ({len(t[1])} seed{'s' if len(t[1]) > 1 else ''})" if t else "not run"

    for c, label in table.columns:
        a = best([r for r in table.rows if r.key in mine], c)
        b = best([r for r in table.rows if r.key not in mine], c)
        diff = paired_cell(a[1], b[1], a[0].metric, b[0].metric) if a and b else "-"
        faster = paired_cell(a[1], b[1], "rounds_to_target", "rounds_to_target", scale=1.0, digits=1) if a and b else "-"
        lines.append(f"| {label} | {name(a)} | {name(b)} | {diff} | {faster} |")
    return "\n".join(lines)


def last_rounds_mean(run: Path, key: str, last: int) -> float | None:
    """Mean of ``key`` in the run's metrics.jsonl over its last ``last`` rounds that record it (None: none do)."""
    vals = list(_curve(run / "metrics.jsonl", key).items())[-last:]
    return float(np.mean([v for _, v in vals])) if vals else None


def render_ablation(table: Table, last: int = ABLATION_LAST, repo: Path = REPO) -> str:
    """One row per variant of the table's single column: BP and AP (:func:`last_rounds_mean` of ``bp_acc`` /
    ``ap_acc``), the best personalized accuracy over all clients and the rounds to the target, each a
    :func:`cell` over the variant's seeds (pFedRLLA Table 2 reports BP and AP). A row read from another table
    (``root``: "Both" is T4's pFedRLLA row) counts only the seeds some variant was run at, so that every row is
    the same experiment (T4 has more seeds than the one-seed ablations)."""
    (column, _), = table.columns
    lines = [f"| variant | BP (before local training; mean of the last {last} rounds) | AP (after) | "
             "best personalized accuracy | rounds to the target |", "|---|---|---|---|---|"]
    variant_seeds = {x["seed"] for row in table.rows if not row.root for x in row.runs(table, column, repo)}
    for row in table.rows:
        folder = repo / (row.root or table.root) / column / row.where
        runs = []
        for summary in row.runs(table, column, repo):
            if row.root and summary["seed"] not in variant_seeds:
                continue
            run = folder / f"seed{summary['seed']}"
            runs.append({**summary, "bp_last": last_rounds_mean(run, "bp_acc", last),
                         "ap_last": last_rounds_mean(run, "ap_acc", last)})
        diverged = [x for x in row.runs(table, column, repo, "diverged")
                    if not row.root or x["seed"] in variant_seeds]
        cells = [cell(runs, "bp_last", None, diverged=diverged), cell(runs, "ap_last", None, diverged=diverged),
                 cell(runs, row.metric, None, diverged=diverged),
                 cell(runs, "rounds_to_target", None, 1.0, "target not reached", diverged, 1)]
        lines.append(f"| {row.label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def validation_rows(repo: Path = REPO) -> list[dict]:
    """Per method under results/validation: our and the reference's per-round accuracy, compared round by round
    (ours: the metric ``reference.json`` names in ``fedblend_metric``, default ``acc``)."""
    rows = []
    for ref_file in sorted((repo / "results" / "validation").glob("*/reference.json")):
        folder = ref_file.parent
        ref = json.loads(ref_file.read_text())
        verdict = (folder / "verdict.md").read_text().strip() if (folder / "verdict.md").exists() else "not judged yet"
        if "acc" not in ref:  # nothing to run side by side: the row says why (and what was searched, in the verdict)
            rows.append({"method": folder.name, "status": ref.get("status", "no reference run"),
                         "verdict": " ".join(verdict.split())})
            continue
        metrics = folder / "fedblend" / "metrics.jsonl"
        if not metrics.exists():
            continue
        key = ref.get("fedblend_metric", "acc")  # which of our metrics the reference's curve measures
        ours = _curve(metrics, key)
        theirs = dict(zip(ref["rounds"], ref["acc"]))
        common = sorted(set(ours) & set(theirs))
        if not common:
            continue
        diffs = [(ours[r] - theirs[r]) * 100 for r in common]
        worst = max(range(len(common)), key=lambda i: abs(diffs[i]))
        last = common[-1]
        seeds = []
        for extra in sorted(folder.glob("fedblend-seed*/metrics.jsonl")):
            accs = _curve(extra, key)
            if last in accs:
                seeds.append(accs[last] * 100)
        # fedblend started from the reference's initial weights (config init), and with the options that reproduce
        # the reference's behaviour as well, where run
        same_init, as_ref = (_variant(folder / sub / "metrics.jsonl", key, theirs, common)
                             for sub in ("fedblend-pflib-init", "fedblend-as-reference"))
        if as_ref is None:  # the reference's options from fedblend's own initial weights
            as_ref = _variant(folder / "fedblend-reference-options" / "metrics.jsonl", key, theirs, common)
            if as_ref is not None:
                as_ref["own_init"] = True
        rows.append({"method": folder.name + ("" if key == "acc" else f" (`{key}`)"), "repository": ref.get("repository", "?"),
                     "commit": str(ref.get("commit", "?"))[:10], "setting": ref.get("setting", ""),
                     "rounds": len(common), "max_diff": diffs[worst], "max_round": common[worst], "last": last,
                     "ours": ours[last] * 100, "theirs": theirs[last] * 100, "other_seeds": seeds,
                     "same_init": same_init, "as_reference": as_ref,
                     "verdict": " ".join(verdict.split())})
    return rows


def _variant(metrics: Path, key: str, theirs: dict[int, float], common: list[int]) -> dict | None:
    """A variant run's largest per-round difference to the reference (signed, with its round) and its last-round
    accuracy, over the rounds both have (None when the run is absent or does not cover them)."""
    if not metrics.exists():
        return None
    accs = _curve(metrics, key)
    d = [(accs[r] - theirs[r]) * 100 for r in common if r in accs]
    if len(d) != len(common):
        return None
    w = max(range(len(d)), key=lambda i: abs(d[i]))
    return {"max_diff": d[w], "max_round": common[w], "ours": accs[common[-1]] * 100,
            "mean_diff": sum(d) / len(d)}


def _curve(metrics: Path, key: str) -> dict[int, float]:
    """``{round: value of key}`` of a run's metrics.jsonl."""
    return {m["round"]: m[key] for m in map(json.loads, metrics.read_text().splitlines()) if key in m}


def render_validation(repo: Path = REPO) -> str:
    lines = ["| method | reference (repository, commit) | rounds | max per-round difference (points) | "
             "last round: ours / reference % | other seeds (ours) % | from the reference's initial weights: max "
             "difference; last round ours % | with the reference's options (and initial weights unless marked): max difference; "
             "mean difference; last round ours % | verdict |", "|---|---|---|---|---|---|---|---|---|"]
    for r in validation_rows(repo):
        if "status" in r:
            lines.append(f"| {r['method']} | {r['status']} | - | - | - | - | - | - | {r['verdict']} |")
            continue
        seeds = " / ".join(f"{v:.2f}" for v in r["other_seeds"]) or "-"
        si, ar = r["same_init"], r["as_reference"]
        same = "-" if si is None else f"{si['max_diff']:+.2f} (round {si['max_round']}); {si['ours']:.2f}"
        asref = "-" if ar is None else (f"{ar['max_diff']:+.2f} (round {ar['max_round']}); {ar['mean_diff']:+.2f}; "
                                        f"{ar['ours']:.2f}" + (" (own initial weights)" if ar.get("own_init") else ""))
        lines.append(f"| {r['method']} | {r['repository']} @ {r['commit']} | {r['rounds']} | {r['max_diff']:+.2f} "
                     f"(round {r['max_round']}) | {r['ours']:.2f} / {r['theirs']:.2f} ({r['ours'] - r['theirs']:+.2f}) "
                     f"| {seeds} | {same} | {asref} | {r['verdict']} |")
    return "\n".join(lines)


def _validation2():
    """bookkeeping/validation2.py (not a package: loaded from its path, as the tests load this module)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("validation2", Path(__file__).with_name("validation2.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("validation2", mod)
    spec.loader.exec_module(mod)
    return mod


RENDERERS = {**{name: (t.doc, lambda t=t, repo=REPO: render(t, repo)) for name, t in TABLES.items()},
             "validation-rule": ("docs/validation.md", lambda repo=REPO: _validation2().render_both(
                 repo / "results" / "validation", repo / "results" / "validation-2")),
             "validation-init-pairs": ("docs/validation.md", lambda repo=REPO: _validation2().render_init_pairs(
                 repo / "results" / "validation")),
             "validation2-verdicts": ("docs/validation-2.md",
                                      lambda repo=REPO: _validation2().render_verdicts(repo / "results" / "validation-2")),
             "validation2-paired": ("docs/validation-2.md",
                                    lambda repo=REPO: _validation2().render_paired(repo / "results" / "validation-2")),
             "t1-vs-fedapa": ("docs/benchmarks.md", lambda repo=REPO: render_paired(T1, "fedapa", repo)),
             "t4-vs-pfedrlla": ("docs/benchmarks.md", lambda repo=REPO: render_paired(T4, "pfedrlla", repo, per_seed=True)),
             "t4-verdict": ("docs/benchmarks.md",
                            lambda repo=REPO: render_verdict(T4, T4_MINE, repo)),
             "t4-ablations": ("docs/benchmarks.md", lambda repo=REPO: render_ablation(T4_ABLATIONS, repo=repo)),
             "t4-500": ("docs/benchmarks.md", lambda repo=REPO: render_metrics(T4_500, "fmnist-pat2", repo)),
             "t4-500-vs-pfedrlla": ("docs/benchmarks.md",
                                    lambda repo=REPO: render_paired(T4_500, "pfedrlla", repo, per_seed=True)),
             "validation": ("docs/validation.md", lambda repo=REPO: render_validation(repo))}


# ------------------------------------------------------------------------------------------------ what is left
#: the campaigns' grid (issues #21 and #25): (table, column, the rows it needs (None: every row that applies),
#: seeds per row). T4's Dir(0.1) column needs the pFedRLLA rows and the two best baselines of the main column
#: (:func:`best_others`); the ALA table one seed per row, three for a pair whose gain is unclear (:func:`ala_unclear`).
T4_DIR_BEST = 2
GOALS = (
    (T1, "pat", None, 3), (T1, "dir", None, 3),
    (T3, "pat", None, 3),
    (ALA, "dir", None, 1),
    (T4, "fmnist-pat2", None, 3), (T4, "mnist-domains", None, 1),
    (T4, "fmnist-dir0.1", "pfedrlla-and-best", 1),
    (T4_ABLATIONS, "fmnist-pat2", None, 1),
    (T2_CNN, "mnist", None, 1), (T2_CNN, "fmnist", None, 1),
    (T4_500, "fmnist-pat2", None, 1),
)
#: an ALA gain at least this large (points, the mean over the seeds both rows have) has a clear sign at one seed
ALA_CLEAR = 1.0


def seeds_run(row: Row, table: Table, column: str, repo: Path = REPO) -> list[int]:
    """The seeds of a row's finished or diverged runs (a diverged run is a result: the tables name it)."""
    return sorted({s["seed"] for st in ("finished", "diverged") for s in row.runs(table, column, repo, st)})


def best_others(table: Table, column: str, mine: tuple[str, ...], n: int, repo: Path = REPO) -> list[str]:
    """The ``n`` best rows of ``column`` that are not ``mine``, by the mean of their metric over seeds."""
    scored = []
    for r in table.rows:
        vals = [x[r.metric] for x in r.runs(table, column, repo) if x.get(r.metric) is not None]
        if r.key not in mine and vals:
            scored.append((float(np.mean(vals)), r.key))
    return [k for _, k in sorted(scored, reverse=True)[:n]]


def ala_unclear(table: Table, column: str, repo: Path = REPO) -> set[str]:
    """The ALA pairs (host and host+ala keys) whose gain's sign is not yet clear: under :data:`ALA_CLEAR` points on
    average, or of both signs over the seeds. A pair whose +ala run diverged is settled (its finding is the
    divergence), and so is one with three paired seeds."""
    out = set()
    rows = {r.key: r for r in table.rows}
    for key, row in rows.items():
        if not key.endswith("+ala") or key[:-4] not in rows:
            continue
        host = rows[key[:-4]]
        _, a, b = paired_values(row.runs(table, column, repo), host.runs(table, column, repo), row.metric,
                                host.metric)
        gains = a - b
        if not len(gains) or len(gains) >= 3:
            continue
        if abs(np.mean(gains)) < ALA_CLEAR or min(gains) < 0 < max(gains):
            out |= {host.key, key}
    return out


def run_minutes(runs: list[dict]) -> float | None:
    """The mean minutes of a run (``seconds_per_round`` x ``rounds`` of each summary; None without runs): what
    one more run of the same row costs on the machine and load that ran these (two runs sharing 2 cores)."""
    vals = [s["seconds_per_round"] * s["rounds"] / 60 for s in runs if s.get("seconds_per_round") and s.get("rounds")]
    return float(np.mean(vals)) if vals else None


@dataclass(frozen=True)
class Missing:
    """A row of :data:`GOALS` that misses seeds: the seeds it has and lacks, and the minutes one run takes
    (``own``: measured on the row's own runs of the column; otherwise an estimate)."""

    table: Table
    column: str
    row: Row
    have: list[int]
    missing: list[int]
    minutes: float | None
    own: bool
    unclear: bool


def missing_runs(repo: Path = REPO) -> list[Missing]:
    """The rows of :data:`GOALS` that miss seeds (the missing seeds are the lowest ones the row lacks), with the
    minutes one run takes (:func:`run_minutes`: the row's runs, else the row's runs in the table's other columns,
    else, for a row of its own config, the runs of the shared-setting row it stands beside (the same method: in
    the column, else in any), else the median of its column's rows)."""
    out = []
    for table, column, which, need in GOALS:
        rows = [r for r in table.rows if r.applies(column)]
        if which == "pfedrlla-and-best":
            keep = set(T4_MINE) | set(best_others(table, "fmnist-pat2", T4_MINE, T4_DIR_BEST, repo))
            rows = [r for r in rows if r.key in keep]
        unclear = ala_unclear(table, column, repo) if table.gains else set()
        costs = [m for r in table.rows if (m := run_minutes(r.runs(table, column, repo))) is not None]
        for r in rows:
            have = seeds_run(r, table, column, repo)
            goal = 3 if r.key in unclear else need
            missing = [k for k in range(goal + len(have)) if k not in have][:max(0, goal - len(have))]
            if missing:
                own = run_minutes(r.runs(table, column, repo))
                elsewhere = run_minutes([x for c, _ in table.columns for x in r.runs(table, c, repo)])
                base = next((b for b in table.rows if b.key == r.beside), None)
                beside = (None, None) if base is None else (
                    run_minutes(base.runs(table, column, repo)),
                    run_minutes([x for c, _ in table.columns for x in base.runs(table, c, repo)]))
                cost = next((m for m in (own, elsewhere, *beside, float(np.median(costs)) if costs else None)
                             if m is not None), None)
                out.append(Missing(table, column, r, have, missing, cost, own is not None, r.key in unclear))
    return out


def left(repo: Path = REPO) -> list[str]:
    """One line per row of :data:`GOALS` that misses seeds (:func:`missing_runs`): ``table column row: have [..],
    missing [..]`` with the minutes a run takes ("about" when estimated), and a last line with the total."""
    lines, total, count = [], 0.0, 0
    for m in missing_runs(repo):
        lines.append(f"{m.table.name} {m.column} {m.row.key}: have {m.have}, missing {m.missing}"
                     + (" (ALA gain's sign unclear)" if m.unclear else "")
                     + ("" if m.minutes is None else f"; {'' if m.own else 'about '}{m.minutes:.0f} min a run"))
        total += (m.minutes or 0.0) * len(m.missing)
        count += len(m.missing)
    if count:
        lines.append(f"left: {count} runs, about {total / 60:.1f} hours of run time (two at a time: about "
                     f"{total / 120:.1f} hours)")
    return lines


# ------------------------------------------------------------------------------------------------ how to run it
#: T4's columns as config names: ``configs/t4/<prefix>-<row>.toml`` (or ``configs/benchmarks/``) where a row has
#: its own config, else ``<prefix>-fedavg.toml`` with the row's method (its options at their defaults)
T4_PREFIX = {"fmnist-pat2": "t4-fmnist-pat2", "mnist-domains": "t4-mnist_star-domains",
             "fmnist-dir0.1": "t4-fmnist-dir0.1"}
#: T4's budget (the configs hold the 20-round one of the first measurements)
T4_BUDGET = ("rounds=100", "eval.every=10")
#: rows that are another row's config with options changed: (that row, the overrides)
T4_DERIVED = {"pfedrlla-transfer": ("pfedrlla", ("options.agent=agents/t4-fmnist-pat4.pt",))}
CONFIG_DIRS = ("configs/t4", "configs/benchmarks")


def header_field(config: Path, key: str) -> str | None:
    """A field of a run's ``config.toml`` header comment (``# git_commit: ...``), None when absent."""
    for line in config.read_text().splitlines():
        if line.startswith(f"# {key}: "):
            return line.split(": ", 1)[1].strip()
    return None


def recipe(table: Table, column: str, key: str, repo: Path = REPO) -> tuple[str, list[str]] | None:
    """How a T4 row is run before any of its seeds exists in ``column``: a config under ``configs/`` (relative to
    the repository) and its ``--set`` overrides (:data:`T4_PREFIX`, :data:`T4_BUDGET`, :data:`T4_DERIVED`); a row
    of its own config (``Row.config``, any table) is that config, as it is; a T2 MNIST-CNN row its config
    (:data:`T2_CNN`); a 500-round T4 row its 100-round run's config with 500 rounds (:data:`T4_500`);
    None for the other rows of the other tables (every shared-setting row of T1, T3 and the ALA
    table has a run to copy)."""
    row = next((r for r in table.rows if r.key == key), None)
    if row is not None and row.config:
        return row.config.format(column=column), []
    if table.name == T2_CNN.name:
        return f"configs/benchmarks/t2-{column}-cnn5-{key}.toml", []
    if table.name == T4_500.name:
        hundred = f"results/t4/{column}/{key}/seed0/config.toml"
        return (hundred, ["rounds=500", f"name=t4-500-{column}-{key}"]) if (repo / hundred).exists() else None
    if table.name not in ("t4", "t4-ablations") or column not in T4_PREFIX:
        return None
    prefix = T4_PREFIX[column]
    base, extra = T4_DERIVED.get(key, (key, ()))
    sets = [*T4_BUDGET]
    for d in CONFIG_DIRS:
        if (repo / d / f"{prefix}-{base}.toml").exists():
            if base != key:
                sets.append(f"name={prefix}-{key}")
            return f"{d}/{prefix}-{base}.toml", sets + list(extra)
    for d in CONFIG_DIRS:
        if (repo / d / f"{prefix}-fedavg.toml").exists():
            return f"{d}/{prefix}-fedavg.toml", sets + [f"method={key}", f"name={prefix}-{key}", *extra]
    return None


def _agent_pretrain(config: Path, repo: Path) -> tuple[str, float | None, str] | None:
    """The pre-training run behind a pFedRLLA config's ``options.agent`` file when that file is not in ``repo``:
    (its commit, minutes, command), from ``results/t4/pretrain/*/seed0`` (whose ``agent.sha256`` names the file)."""
    import tomllib

    agent = tomllib.loads(config.read_text()).get("options", {}).get("agent") or ""
    if not agent or (repo / agent).exists():
        return None
    for sha in sorted((repo / "results/t4/pretrain").glob("*/seed0/agent.sha256")):
        if sha.read_text().split()[-1] == Path(agent).name:
            cfg = sha.parent / "config.toml"
            return (header_field(cfg, "git_commit") or "HEAD", run_minutes(load_runs(sha.parent.parent)),
                    f"fedblend pretrain {cfg} --out {agent}")
    return ("HEAD", None, f"# no pre-training run in results/t4/pretrain names {agent}")


def commands(repo: Path = REPO, out_root: str = "runs") -> list[str]:
    """The commands that produce what :func:`missing_runs` lists, one per line as ``MINUTES<TAB>COMMIT<TAB>
    COMMAND``: run each from a checkout of COMMIT (``HEAD``: this one). A seed of a row that has a run in the
    column repeats that run's ``config.toml`` (the resolved config, so the same code gives the same run but for
    its seed); a row without one uses :func:`recipe` at the commit of the column's other runs, or, for a row of
    its own config (``Row.config``, a config newer than those runs), at ``HEAD``. A pre-trained
    agent that is not on disk is preceded by its pre-training (:func:`_agent_pretrain`). Rows read from another
    row's or table's runs (``folder`` / ``root``) are that row's runs, and get a comment line instead.
    Finished runs go back with :func:`collect_left` (``tables.py collect-left OUT_ROOT``)."""
    lines, pretrains = [], set()
    for m in missing_runs(repo):
        tag = f"{m.table.name} {m.column} {m.row.key}"
        if m.row.folder or m.row.root:
            lines.append(f"# {tag}: the runs of {m.row.root or m.table.root}/{m.column}/{m.row.where}")
            continue
        mine = sorted((repo / m.table.root / m.column / m.row.key).glob("seed*/config.toml"))
        if mine:
            config, commit, sets = mine[0], header_field(mine[0], "git_commit") or "HEAD", []
            cmd = f"fedblend run {config}"
        else:
            how = recipe(m.table, m.column, m.row.key, repo)
            if how is None:
                lines.append(f"# {tag}: no run and no recipe (tables.py recipe)")
                continue
            config, sets = repo / how[0], how[1]
            column_runs = sorted((repo / m.table.root / m.column).glob("*/seed*/config.toml"))
            commit = "HEAD" if m.row.config else next(
                (c for f in column_runs if (c := header_field(f, "git_commit"))), "HEAD")
            cmd = f"fedblend run {how[0]}" + "".join(f" --set {s}" for s in sets)
        pre = _agent_pretrain(config, repo) if config.is_file() else None  # a row's own config: named, not read
        if pre is not None and pre[2] not in pretrains:
            pretrains.add(pre[2])
            lines.append(pre[2] if pre[2].startswith("#") else
                         f"{'?' if pre[1] is None else f'{pre[1]:.0f}'}\t{pre[0]}\t{pre[2]}")
        minutes = "?" if m.minutes is None else f"{m.minutes:.0f}"
        for seed in m.missing:
            lines.append(f"{minutes}\t{commit}\t{cmd} --set seed={seed} "
                         f"--out {out_root}/{m.table.name}/{m.column}/{m.row.key}/seed{seed}")
    return lines


# ------------------------------------------------------------------------------------------------ docs
BLOCK = re.compile(r"(<!-- table:(?P<name>[\w-]+) -->)(?P<body>.*?)(<!-- /table:(?P=name) -->)", re.S)


def regenerate(text: str, repo: Path = REPO) -> tuple[str, list[str]]:
    """``text`` with every generated block rebuilt, and the names of the blocks that changed."""
    changed = []

    def sub(m: re.Match) -> str:
        name = m.group("name")
        if name not in RENDERERS:
            raise SystemExit(f"tables: unknown table {name!r} in a doc (known: {', '.join(RENDERERS)})")
        body = "\n" + RENDERERS[name][1](repo=repo) + "\n"
        if body != m.group("body"):
            changed.append(name)
        return m.group(1) + body + m.group(4)

    return BLOCK.sub(sub, text), changed


def docs(repo: Path = REPO) -> list[Path]:
    return sorted({repo / doc for doc, _ in RENDERERS.values() if (repo / doc).exists()})


def check(repo: Path = REPO) -> list[str]:
    """``doc: table`` for every generated block whose text differs from what results/ gives."""
    out = []
    for path in docs(repo):
        _, changed = regenerate(path.read_text(), repo)
        out += [f"{path.relative_to(repo)}: {name}" for name in changed]
    return out


def copy_run(run: Path, out: Path) -> None:
    """A run's three files (:data:`RUN_FILES`) from ``run`` into ``out`` (made as needed)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in RUN_FILES:
        shutil.copy2(run / f, out / f)


def agent_record(run: Path, base: Path) -> str | None:
    """For a run whose config loads an agent file (``options.agent``, relative to ``base``, the runs' working
    directory) and whose ``summary.json`` does not record that file's sha256 itself (``run.inputs``: runs from
    8b98e5f on do): the ``agent.sha256`` line (``sha256sum``'s format) of the file as it is now, the agent the run
    loaded as long as no pre-training rewrote it since (``bookkeeping/campaign.py`` starts a pre-trained row only
    after its pre-training has ended). A re-made agent can differ from the committed one (another CPU), so the
    run must say which it loaded. None when there is nothing to record; stops when the file is gone."""
    import tomllib

    agent = tomllib.loads((run / "config.toml").read_text()).get("options", {}).get("agent") or ""
    if not agent or json.loads((run / "summary.json").read_text()).get("run", {}).get("inputs"):
        return None
    if not (base / agent).exists():
        raise SystemExit(f"{run}: its agent file {base / agent} is gone; record which agent it loaded by hand")
    return f"{hashlib.sha256((base / agent).read_bytes()).hexdigest()}  {Path(agent).name}\n"


def collect(sweep: Path, dest: Path, row: str | None = None) -> list[Path]:
    """Copy every finished or diverged run under ``sweep`` to ``dest/<row>/seed<S>`` (its three run files only;
    a diverged run is a result too: the tables name it and never average it); the row is the run's method unless
    given (two rows of one method, e.g. pFedRLLA with and without its pre-trained agent)."""
    copied = []
    for summary in sorted(sweep.rglob("summary.json")):
        s = json.loads(summary.read_text())
        if s.get("status", "finished") not in ("finished", "diverged"):
            continue
        out = dest / (row or s["method"]) / f"seed{s['seed']}"
        copy_run(summary.parent, out)
        copied.append(out)
    return copied


def collect_left(out_root: Path, repo: Path = REPO) -> tuple[list[Path], list[Path]]:
    """Copy the finished or diverged runs that :func:`commands` placed under ``out_root/<table>/<column>/<row>/
    seed<S>`` into their table's results folder (``<table root>/<column>/<row>/seed<S>``, the three run files,
    and for a pre-trained row the sha256 of the agent it loaded, :func:`agent_record`, with ``out_root``'s parent
    as the runs' working directory); a seed already in ``results/`` is left as it is. Returns (copied, skipped:
    already there)."""
    roots = {t.name: t.root for t, *_ in GOALS}
    copied, skipped = [], []
    for summary in sorted(out_root.glob("*/*/*/seed*/summary.json")):
        run = summary.parent
        table, column, row = run.relative_to(out_root).parts[:3]
        s = json.loads(summary.read_text())
        if table not in roots or s.get("status", "finished") not in ("finished", "diverged"):
            continue
        out = repo / roots[table] / column / row / run.name
        if out.exists():
            skipped.append(out)
            continue
        agent = agent_record(run, out_root.parent)  # before copying: a run is never left without it
        copy_run(run, out)
        if agent:
            (out / "agent.sha256").write_text(agent)
        copied.append(out)
    return copied, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check; exit 1 if a generated table is stale")
    sub = ap.add_subparsers(dest="cmd")
    c = sub.add_parser("collect", help="copy a sweep's finished runs into results/")
    c.add_argument("sweep")
    c.add_argument("dest")
    c.add_argument("--row", help="the row folder (default: each run's method)")
    cl = sub.add_parser("collect-left", help="copy the finished runs of `left --commands` into results/")
    cl.add_argument("out_root", help="the --out-root the commands used (default there: runs)")
    lp = sub.add_parser("left", help="the campaigns' runs still missing from results/ (row, seeds)")
    lp.add_argument("--commands", action="store_true",
                    help="print MINUTES<TAB>COMMIT<TAB>COMMAND lines that run them instead")
    lp.add_argument("--out-root", default="runs", help="where --commands puts the runs (default: runs)")
    args = ap.parse_args(argv)
    if args.cmd == "left":
        lines = commands(out_root=args.out_root) if args.commands else left()
        print("\n".join(lines) if lines else "every campaign row has its seeds")
        return 0
    if args.cmd == "collect-left":
        copied, skipped = collect_left(Path(args.out_root))
        for p in copied:
            print(p.relative_to(REPO))
        for p in skipped:
            print(f"{p.relative_to(REPO)}: already in results/, left as it is")
        return 0
    if args.cmd == "collect":
        for p in collect(Path(args.sweep), Path(args.dest), args.row):
            print(p)
        return 0
    if args.check:
        stale = check()
        for s in stale:
            print(f"stale: {s} (run python bookkeeping/tables.py)")
        return 1 if stale else 0
    for path in docs():
        new, changed = regenerate(path.read_text())
        if changed:
            path.write_text(new)
            print(f"{path.relative_to(REPO)}: {', '.join(changed)}")
    return 0


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly, as for any Unix tool
    sys.exit(main())
