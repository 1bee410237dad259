"""Figures a paper can use: titles from the method and setting, legends by method, stated seeds and bands.

Pure functions over resolved configs (``summary.json``'s ``run.config``, or ``config.toml``) and metrics rows;
matplotlib is imported only by the plotting functions (``pip install 'fedblend[plot]'``).

* :func:`method_name` -- ``"fedprox+ala"`` -> ``"FedProx+ALA"`` (the papers' spelling; a plug-in keeps its own);
* :func:`setting_text` -- ``"FMNIST, Dir(0.1), 20 clients, LeNet-5"`` from the dataset, partition and model;
* :func:`plot_run_accuracy` -- a run's ``accuracy.png``: pooled personalized (and global) accuracy per round,
  the clients' 10th-90th percentile band and the worst client, titled by method and setting;
* :func:`plot_client_distribution` -- ``report``'s ``per_client.png``: every client's accuracy at the final
  round, one box per method (all seeds pooled), worst client and 10th percentile marked.
"""

from __future__ import annotations

import json
import sys
import textwrap
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedblend.common.optional import MissingPackageError, pyplot
from fedblend.core.evaluation import client_accuracies

METHOD_NAMES = {
    "fedavg": "FedAvg", "fedprox": "FedProx", "local": "Local", "fedavg-ft": "FedAvg-FT", "fedala": "FedALA",
    "ala": "ALA", "fedapa": "FedAPA", "pfedrlla": "pFedRLLA", "fedalp": "FedALP", "fedphp": "FedPHP",
    "fedamp": "FedAMP", "apple": "APPLE", "fedproto": "FedProto", "fedgh": "FedGH", "pfedhn": "pFedHN",
    "pfedla": "pFedLA", "fedpac": "FedPAC", "dbe": "DBE", "perfedavg": "Per-FedAvg", "pfedme": "pFedMe",
    "fedfomo": "FedFomo", "partialfed": "PartialFed", "ditto": "Ditto", "apfl": "APFL", "fedper": "FedPer",
    "fedrep": "FedRep", "fedbabu": "FedBABU",
}
DATASET_NAMES = {"mnist": "MNIST", "fmnist": "FMNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
                 "ag_news": "AG News", "usps": "USPS", "mnist_star": "MNIST*", "synthetic": "synthetic",
                 "synthetic-64k": "synthetic (64k)"}
MODEL_NAMES = {"cnn4": "4-layer CNN", "lenet5": "LeNet-5", "cnn5": "5-layer CNN", "mlp": "MLP", "fasttext": "fastText"}


def method_name(spec: str) -> str:
    """The display name of a method spec: ``"fedprox+ala"`` -> ``"FedProx+ALA"``; a plug-in path
    ``"pkg.mod:MyMethod"`` -> ``"MyMethod"``."""
    return "+".join(METHOD_NAMES.get(p, p.rsplit(":", 1)[-1]) for p in spec.split("+"))


def setting_text(cfg: dict[str, Any], model: bool = True) -> str:
    """``"FMNIST, Dir(0.1), 20 clients, LeNet-5"``: dataset, partition, clients (and join ratio), model."""
    part = cfg.get("partition") or {}
    kind = part.get("kind", "?")
    if kind == "dirichlet":
        how = f"Dir({part.get('alpha'):g})"
    elif kind == "pathological":
        how = f"{part.get('classes_per_client')} classes/client"
    elif kind == "shards":
        how = f"{part.get('shards_per_client')} shards/client"
    else:
        how = {"iid": "IID", "one_class": "one class/client", "domains": "by domain", "indices": "imported split",
               "flwr": f"flwr {part.get('flwr', '')}".strip()}.get(kind, kind)
    clients = f"{part.get('num_clients', '?')} clients"
    samp = cfg.get("sampling") or {}
    if samp.get("scheme", "fixed") == "fixed" and samp.get("join_ratio", 1.0) < 1.0:
        clients += f" ({samp['join_ratio']:g} join)"
    elif samp.get("scheme") == "uniform_range":
        clients += f" ({samp.get('low'):g}-{samp.get('high'):g} join)"
    bits = [DATASET_NAMES.get(cfg.get("dataset", "?"), cfg.get("dataset", "?")), how, clients]
    if model:
        bits.append(MODEL_NAMES.get(cfg.get("model", "?"), cfg.get("model", "?")))
    return ", ".join(bits)


def common_setting(configs: Sequence[dict]) -> str | None:
    """The setting text every config shares, or None when they differ."""
    texts = {setting_text(c) for c in configs if c}
    return texts.pop() if len(texts) == 1 else None


def read_rows(run: Path) -> list[dict]:
    path = Path(run) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_config(run: Path) -> dict:
    """A run directory's resolved config (``summary.json``'s, else ``config.toml``), {} if neither (or neither
    can be read: a figure's title is no reason to fail)."""
    s = Path(run) / "summary.json"
    if s.exists():
        try:
            summary = json.loads(s.read_text())
        except (OSError, ValueError):
            summary = None
        run_info = summary.get("run") if isinstance(summary, dict) else None
        cfg = run_info.get("config") if isinstance(run_info, dict) else None
        if cfg and isinstance(cfg, dict):
            return cfg
    c = Path(run) / "config.toml"
    if c.exists():
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover
            import tomli as tomllib
        try:
            return tomllib.loads(c.read_text())
        except tomllib.TOMLDecodeError:
            return {}
    return {}


def _pyplot():
    return pyplot("a figure")


def integer_rounds(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def plot_run_accuracy(run: Path, path: Path | None = None) -> Path:
    """Write :func:`run_figure` of the run directory ``run`` to ``path`` (default ``run/accuracy.png``)."""
    plt = _pyplot()
    fig = run_figure(run)
    path = Path(path) if path else Path(run) / "accuracy.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def run_figure(run: Path):
    """A run's accuracy per round: pooled personalized test accuracy, the clients' 10th-90th percentile band and
    the worst client (from the rows' ``per_client`` counts), and the global model's where one exists; titled by
    method, setting and seed."""
    plt = _pyplot()
    run = Path(run)
    cfg = run_config(run)
    rows, skipped = evaluated_rows(read_rows(run))
    for line in skipped:  # one line per round left out, never a traceback
        warnings.warn(f"{run / 'metrics.jsonl'}: {line}: left out of the accuracy figure", RuntimeWarning,
                      stacklevel=2)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    marker = "." if len(rows) < 30 else None
    pts = [(r["round"], 100 * r["acc"]) for r in rows]
    if pts:
        ax.plot(*zip(*pts), marker=marker, color="tab:blue", label="personalized (pooled)")
    per = [(r["round"], _client_accs(r)) for r in rows if r.get("per_client")]
    per = [(t, a) for t, a in per if a]
    if per:
        rr = [t for t, _ in per]
        ax.fill_between(rr, [100 * float(np.percentile(a, 10)) for _, a in per],
                        [100 * float(np.percentile(a, 90)) for _, a in per], color="tab:blue", alpha=0.15,
                        label="clients: 10th-90th percentile")
        ax.plot(rr, [100 * min(a) for _, a in per], ls=":", color="tab:blue", label="worst client")
    gpts = [(r["round"], 100 * r["global_acc"]) for r in rows if _number(r.get("global_acc"))]
    if gpts:
        ax.plot(*zip(*gpts), marker=marker, color="tab:orange", label="global model (pooled)")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    n_clients = len(per[-1][1]) if per else 0
    title = method_name(cfg.get("method", "?")) if cfg else run.name
    sub = (setting_text(cfg) + f", seed {cfg.get('seed')}") if cfg else ""
    ax.set_title(f"{title}\n{sub}" if sub else title, fontsize=10)
    if n_clients:
        ax.set_xlabel(f"round   ({n_clients} clients evaluated)")
    integer_rounds(ax)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    fig.tight_layout()
    return fig


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def evaluated_rows(rows: list) -> tuple[list[dict], list[str]]:
    """The metrics rows a figure can draw -- evaluated rounds (an integer ``round``, a numeric ``acc``) -- and
    one line per evaluated-looking row left out (``"round 3: acc is None, not a number"``); rounds that were not
    evaluated (no ``acc``) are neither."""
    keep, skipped = [], []
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "acc" not in r:
            continue
        where = f"round {r['round']}" if isinstance(r.get("round"), int) else f"row {i + 1}"
        if not isinstance(r.get("round"), int):
            skipped.append(f"{where}: round is {r.get('round')!r}, not an integer")
        elif not _number(r["acc"]):
            skipped.append(f"{where}: acc is {r['acc']!r}, not a number")
        else:
            keep.append(r)
    return keep, skipped


def _client_accs(row: dict, key: str = "per_client") -> list[float]:
    """A row's per-client accuracies ([] where its per-client counts are not lists of numbers)."""
    try:
        return list(client_accuracies(row, key).values())
    except (TypeError, AttributeError, ZeroDivisionError):
        return []


def final_client_accuracies(dirs: Sequence[str | Path], key: str = "per_client") -> list[float]:
    """Every client's accuracy at the last evaluated round of each run in ``dirs`` (pooled over the runs)."""
    out: list[float] = []
    for d in dirs:
        rows = [r for r in read_rows(Path(d)) if isinstance(r, dict) and r.get(key)]
        if rows:
            out += _client_accs(rows[-1], key)
    return out


def plot_client_distribution(groups: Sequence[tuple[str, list[float], int]], path: Path, setting: str | None,
                             key: str = "per_client") -> Path:
    """One box per ``(legend, accuracies, seeds)`` group: every client's final-round accuracy over all seeds
    (whiskers at the extremes), the points themselves, and the 10th percentile marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.0, 1.4 * len(groups) + 2.5), 4.6))
    data = [100 * np.asarray(a) for _, a, _ in groups]
    ax.boxplot(data, whis=(0, 100), widths=0.5, showmeans=False, medianprops={"color": "black"})
    rng = np.random.default_rng(0)  # jitter only
    for i, d in enumerate(data, start=1):
        ax.scatter(i + rng.uniform(-0.15, 0.15, len(d)), d, s=9, alpha=0.5, color="tab:blue", zorder=3)
        if len(d):
            p10 = float(np.percentile(d, 10))
            ax.plot([i - 0.3, i + 0.3], [p10, p10], color="tab:red", lw=1.5, zorder=4,
                    label="10th percentile" if i == 1 else None)
    ax.set_xticks(range(1, len(groups) + 1))
    def count(a: list, s: int) -> str:
        if s > 1 and len(a) % s == 0:
            return f"{len(a) // s} clients x {s} seeds"
        return f"{len(a)} clients" + (f", {s} seeds" if s > 1 else ", 1 seed")

    # each label wrapped to its box's width (about 1.4 inches, 8 pt): long legends never run into their neighbours
    ax.set_xticklabels([f"{textwrap.fill(name, 22, break_on_hyphens=False)}\n{count(a, s)}" for name, a, s in groups],
                       fontsize=8)
    who = "global model" if key.startswith("global") else "personalized"
    ax.set_ylabel(f"{who} test accuracy per client (%)")
    ax.set_title("Per-client accuracy at the final round" + (f"\n{setting}" if setting else ""), fontsize=10)
    ax.set_xlabel("box: quartiles; whiskers: worst and best client; points: clients", fontsize=8, color="0.3")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_run(out: Path) -> Path | None:
    """``OUT/accuracy.png``: personalized accuracy per round with the clients' spread (and the global model's,
    where the method has one), titled by method, setting and seed (:func:`fedblend.figures.plot_run_accuracy`);
    skipped with a warning when matplotlib is missing (``pip install 'fedblend[plot]'``)."""
    try:
        pyplot("accuracy.png")
    except MissingPackageError as exc:
        warnings.warn(f"no accuracy.png: {exc} (or [log] plot = false)", RuntimeWarning, stacklevel=2)
        return None
    return plot_run_accuracy(out)
