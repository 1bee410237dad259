"""The Python / notebook API: ``fedblend.run(config)`` returns the summary, the per-round history and each
client's results.

::

    import fedblend

    result = fedblend.run({"method": "fedala", "dataset": "fmnist", "rounds": 5,
                           "partition": {"num_clients": 20, "alpha": 0.1}, "train": {"lr": 0.05}},
                          out="runs/nb", data_dir="../shared/data")
    result.summary["best_accuracy"]      # what summary.json holds
    result.history[-1]["acc"]            # what metrics.jsonl holds, one dict per round
    result.client_accuracies()           # {client: accuracy} at the last evaluated round
    result.per_client()                  # [{round, client, correct, n, accuracy, model}, ...] every evaluation

``config`` is a TOML file path, a dict (nested tables as in TOML, or dotted keys: ``{"train.lr": 0.05}``), a
:class:`~fedblend.config.RunConfig` (a dataclass: ``RunConfig(method="fedprox", train=TrainConfig(lr=0.05))``) or
any dataclass with the same fields; ``overrides`` is a dict or a list of ``--set``-style ``"key=value"`` strings. A
wrong *kind* of argument (a number for a path, one string for the overrides, ``resume="no"``) is a ``TypeError``
naming it, before anything runs. The config goes through the same validation as the command line, so a bad field
raises the :class:`~fedblend.common.errors.ConfigError` whose message ``fedblend run`` prints (``fedblend: error:
<message>``). The run writes the same results directory (``out``, default ``runs/<label>-seed<N>`` as ``fedblend
run`` without ``--out``) and uses one torch thread by default, as ``fedblend run`` and ``sweep`` do (restored
afterwards).

Progress (``progress="auto"``): bars from ``tqdm.auto`` in a Jupyter notebook (widgets where ipywidgets is
installed), the terminal bars of ``fedblend run`` on a terminal, nothing otherwise; ``True`` forces
``tqdm.auto`` bars, ``False`` shows nothing, a callable ``f(metrics_row, simulation)`` is called after every
round.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedblend.common.argtypes import bool_arg, int_arg, overrides_arg, path_arg
from fedblend.common.errors import ConfigError
from fedblend.config import LogConfig, RunConfig, apply_overrides, config_from_dict, load_config
from fedblend.core.evaluation import EvalProtocol, client_accuracies
from fedblend.core.sampling import SamplingConfig
from fedblend.core.training import TrainConfig
from fedblend.data.federated import PartitionSpec
from fedblend.progress import Progress
from fedblend.results.runs import read_metrics, read_summary

__all__ = ["EvalProtocol", "LogConfig", "PartitionSpec", "RunConfig", "RunResult", "SamplingConfig", "TrainConfig",
           "load", "load_config", "open_run", "run"]

ConfigLike = str | Path | Mapping[str, Any] | RunConfig | Any


def load(config: ConfigLike = None, overrides: Mapping[str, Any] | list[str] | None = None) -> RunConfig:
    """A validated :class:`RunConfig` from a TOML path, a dict, a ``RunConfig`` or another dataclass, with
    ``overrides`` applied (a dict of dotted keys, or ``"key=value"`` strings as ``--set`` takes them)."""
    overrides = overrides_arg(overrides, "overrides", mapping=True)
    if config is None or isinstance(config, (str, os.PathLike)):
        config = path_arg(config, "config")
        raw_overrides = _override_strings(overrides)
        if isinstance(overrides, Mapping):  # typed values, no TOML round trip
            cfg = load_config(config, [])
            return config_from_dict(_merge(cfg.to_dict(), _nest(dict(overrides))))
        return load_config(config, raw_overrides)
    if isinstance(config, RunConfig):
        raw = config.to_dict()
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        raw = {k: v for k, v in dataclasses.asdict(config).items() if v is not None}
    elif isinstance(config, Mapping):
        raw = _nest(dict(config))
    else:
        raise TypeError(f"config must be a TOML file path (str or os.PathLike), a dict, a RunConfig or another "
                        f"dataclass, got {type(config).__name__} {config!r:.60}")
    if isinstance(overrides, Mapping):
        raw = _merge(raw, _nest(dict(overrides)))
    elif overrides:
        raw = apply_overrides(raw, list(overrides))
    return config_from_dict(raw)


def _override_strings(overrides) -> list[str]:
    return [] if isinstance(overrides, Mapping) else list(overrides)


def _nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"train.lr": 0.05, "rounds": 3}`` -> ``{"train": {"lr": 0.05}, "rounds": 3}`` (nested dicts kept)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r}")
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
        parts = key.split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"{key}: {p} is not a table")
        if isinstance(value, Mapping) and isinstance(node.get(parts[-1]), dict):
            node[parts[-1]] = _merge(node[parts[-1]], _nest(dict(value)))
        else:
            node[parts[-1]] = _nest(dict(value)) if isinstance(value, Mapping) else value
    return out


def _merge(base: dict, extra: dict) -> dict:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


# ------------------------------------------------------------------------------------------------ the result
@dataclass
class RunResult:
    """A finished (or loaded) run: its config, results directory, summary and per-round history."""

    config: RunConfig | None
    out: Path
    summary: dict
    history: list[dict] = field(repr=False)

    @property
    def evaluated(self) -> list[dict]:
        """The history's evaluated rounds (those with ``acc``)."""
        return [m for m in self.history if "acc" in m]

    def client_accuracies(self, round: int | None = None, model: str = "personalized") -> dict[int, float]:
        """``{client: accuracy}`` at evaluated round ``round`` (default: the last one); ``model="global"`` for the
        global model's."""
        rows = self.evaluated if round is None else [m for m in self.evaluated if m["round"] == round]
        if not rows:
            raise ValueError(f"no evaluated round {round}" if round is not None else "no evaluated round")
        return client_accuracies(rows[-1], _key(model))

    def per_client(self, model: str = "personalized") -> list[dict]:
        """One dict per (evaluated round, client): ``round``, ``client``, ``correct``, ``n``, ``accuracy`` (None for
        a client without test samples) and ``model``."""
        out = []
        for m in self.evaluated:
            pc = m.get(_key(model)) or {}
            for c, k, n in zip(pc.get("clients", ()), pc.get("correct", ()), pc.get("n", ())):
                out.append({"round": m["round"], "client": c, "correct": k, "n": n,
                            "accuracy": k / n if n else None, "model": model})
        return out

    def client_stats(self) -> list[dict]:
        """One dict per (round, client that reported a stat kept per client): ``round``, ``client`` and each of
        the round's per-client stats (``stats_per_client``: every loss the client reported, ``train_loss`` and any
        other ``*_loss``, and what the method names in ``per_client_stats``, e.g. ALA's; None where that client
        reported none of a key)."""
        out = []
        for m in self.history:
            pc = m.get("stats_per_client") or {}
            keys = [k for k in pc if k != "clients"]
            for i, c in enumerate(pc.get("clients", ())):
                out.append({"round": m["round"], "client": c, **{k: pc[k][i] for k in keys}})
        return out

    def to_pandas(self):
        """The history's scalar columns as a ``pandas.DataFrame`` (needs pandas)."""
        import pandas as pd

        return pd.DataFrame([{k: v for k, v in m.items() if not isinstance(v, (list, dict))} for m in self.history])

    def plot(self):
        """The run's accuracy figure (as ``accuracy.png``: per round, with the clients' spread); needs matplotlib."""
        from fedblend.results.figures import run_figure

        return run_figure(self.out)

    def __repr__(self) -> str:
        s = self.summary
        acc = s.get("best_accuracy")
        shown = round(acc, 4) if isinstance(acc, (int, float)) and not isinstance(acc, bool) else repr(acc)
        return (f"RunResult({s.get('method')!r} seed {s.get('seed')}, {len(self.history)} rounds, best accuracy "
                f"{shown}, out={str(self.out)!r})")


def _key(model: str) -> str:
    if model not in ("personalized", "global"):
        raise ValueError(f"model must be 'personalized' or 'global', got {model!r}")
    return "per_client" if model == "personalized" else "global_per_client"


def open_run(out: str | Path) -> RunResult:
    """The :class:`RunResult` of a results directory written earlier (by ``fedblend run``, a sweep or :func:`run`)."""
    out = path_arg(out, "out", optional=False)
    if not (out / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{out}: no metrics.jsonl (not a run directory)")
    summary = read_summary(out, f"leave {out} out, or run it again (summary.json is written at the end of a run)")
    cfg = None
    if (out / "config.toml").exists():
        try:
            cfg = load_config(out / "config.toml")
        except ConfigError:
            cfg = None  # e.g. a plug-in that is not installed here: the numbers are still readable
    fix = f"continue the run (fedblend run {out}/config.toml --out {out} --resume), delete the line, or leave {out} out"
    return RunResult(cfg, out, summary, read_metrics(out, fix))


# ------------------------------------------------------------------------------------------------ progress
def in_notebook() -> bool:
    """Whether this is a Jupyter kernel (IPython's ZMQ shell)."""
    ipy = sys.modules.get("IPython")
    if ipy is None or "ipykernel" not in sys.modules:
        return False
    shell = getattr(ipy, "get_ipython", lambda: None)()
    return type(shell).__name__ == "ZMQInteractiveShell"


class NotebookProgress(Progress):
    """``tqdm.auto`` bars (a widget in a notebook): rounds with accuracy, loss and seconds per round, and the
    clients of the current round or evaluation (the client bar and closing are the terminal display's).
    Reads metrics only; changes no result."""

    def __init__(self, total: int, label: str):
        from tqdm.auto import tqdm

        self.total, self.last_acc = total, None
        self.rounds = tqdm(total=total, desc=label, unit="round")
        self.clients = tqdm(total=0, desc="clients", unit="client", leave=False)

    def __call__(self, m: dict, sim) -> None:
        if self.rounds is None:
            return
        if "acc" in m:
            self.last_acc = m["acc"]
        per = m["seconds"] + m.get("eval_seconds", 0.0)
        acc = f"acc {self.last_acc:.4f} " if self.last_acc is not None else ""
        self.rounds.set_postfix_str(f"{acc}loss {m['train_loss']:.4f} {per:.2f}s/round", refresh=False)
        self.rounds.update(m["round"] - self.rounds.n)


def make_progress(progress: Any, total: int, label: str):
    """The progress display for ``progress`` (see the module docstring), or None."""
    if progress is None or progress is False:
        return None
    if callable(progress):
        return progress
    if progress is not True and progress != "auto":
        raise ConfigError(f"progress must be 'auto', True, False or a callable, got {progress!r}")
    if progress is True or in_notebook():
        return NotebookProgress(total, label)
    if hasattr(sys.stderr, "isatty") and sys.stderr.isatty():
        return Progress(total, label)
    return None


# ------------------------------------------------------------------------------------------------ run
def run(config: ConfigLike = None, out: str | Path | None = None, *, data_dir: str | Path | None = None,
        overrides: Mapping[str, Any] | list[str] | None = None, progress: bool | str | Callable = "auto",
        resume: bool = False, force: bool = False, threads: int | None = 1, backend: Any = None,
        allow_code_change: bool = False) -> RunResult:
    """Run ``config`` (see the module docstring) and return its :class:`RunResult`.

    ``out``: the results directory (default ``runs/<label>-seed<N>``, a new one per run; with ``resume``, the
    existing one). ``resume`` / ``force`` / ``allow_code_change`` as ``fedblend run --resume / --force /
    --allow-code-change``. ``threads``: torch CPU threads
    during the run (default 1, as the command line; None leaves torch's setting). Raises what ``fedblend run``
    reports as ``fedblend: error: ...`` (:mod:`fedblend.common.errors`)."""
    import torch

    from fedblend.experiment import default_out_dir, run_experiment

    out, data_dir = path_arg(out, "out"), path_arg(data_dir, "data_dir")
    resume, force, threads = bool_arg(resume, "resume"), bool_arg(force, "force"), int_arg(threads, "threads")
    cfg = load(config, overrides)
    if threads is not None and threads < 1:
        raise ConfigError(f"threads must be >= 1, got {threads}")
    if resume and force:
        raise ConfigError("--resume continues the run in OUT and --force replaces it: give one of them")
    if out is None:
        out = Path("runs") / f"{cfg.label}-seed{cfg.seed}" if resume else default_out_dir(cfg)
    out = Path(out)
    display = make_progress(progress, cfg.rounds, cfg.label)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        summary = run_experiment(cfg, out, data_dir, resume=resume, progress=display, force=force, backend=backend,
                                 allow_code_change=allow_code_change)
    finally:
        if threads is not None:
            torch.set_num_threads(before)
        if hasattr(display, "close"):
            display.close()
    return RunResult(cfg, out, summary, read_metrics(out))
